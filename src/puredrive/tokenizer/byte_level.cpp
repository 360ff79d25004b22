#include "puredrive/tokenizer/byte_level.h"

#include "puredrive/tokenizer/utf8.h"

namespace pd::tok {

const ByteLevelAlphabet& byte_level_alphabet() {
  static const ByteLevelAlphabet alphabet = [] {
    ByteLevelAlphabet a;
    a.cp_to_byte.fill(-1);
    // Printable Latin-1 bytes stand for themselves; the others are moved, in order, to 256 and up.
    char32_t next_moved = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : next_moved++;
      a.byte_to_cp[b] = cp;
      append_utf8(a.byte_to_utf8[b], cp);
      a.cp_to_byte[cp] = static_cast<int16_t>(b);
    }
    return a;
  }();
  return alphabet;
}

void byte_level_encode(std::string_view in, std::string& out) {
  const auto& a = byte_level_alphabet();
  for (const char c : in) out.append(a.byte_to_utf8[static_cast<uint8_t>(c)]);
}

void byte_level_decode_token(std::string_view token, std::string& out) {
  const auto& a = byte_level_alphabet();
  const size_t start = out.size();
  size_t i = 0;
  while (i < token.size()) {
    const char32_t cp = next_code_point(token, i);
    if (cp > ByteLevelAlphabet::kMaxCp || a.cp_to_byte[cp] < 0) {
      out.resize(start);
      out.append(token);
      return;
    }
    out.push_back(static_cast<char>(a.cp_to_byte[cp]));
  }
}

}  // namespace pd::tok
