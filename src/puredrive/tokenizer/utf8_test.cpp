#include "puredrive/tokenizer/utf8.h"

#include <gtest/gtest.h>

#include "puredrive/tokenizer/byte_level.h"
#include "puredrive/tokenizer/test_data.h"

namespace pd::tok {
namespace {

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

// Expected texts: Python's bytes.decode("utf-8", errors="replace").
TEST(Utf8, LossyDecodeMatchesPython) {
  const auto cases = testing::read_jsonl(testing::reference_dir() + "/utf8_lossy_reference.jsonl");
  ASSERT_GT(cases.size(), 500u);
  for (const auto& c : cases) {
    const std::string bytes = from_hex(c["bytes"].get<std::string>());
    const std::string expected = c["text"].get<std::string>();
    ASSERT_EQ(lossy_utf8(bytes), expected) << "bytes " << c["bytes"];
    EXPECT_EQ(find_invalid_utf8(bytes) == std::string_view::npos, expected == bytes)
        << "bytes " << c["bytes"];
  }
}

// Decoding in pieces, holding back incomplete characters, gives the text of decoding at once; nothing
// emitted midway is invalid UTF-8.
TEST(Utf8, LossyDecodeInPiecesMatchesWhole) {
  const auto cases = testing::read_jsonl(testing::reference_dir() + "/utf8_lossy_reference.jsonl");
  for (const auto& c : cases) {
    const std::string bytes = from_hex(c["bytes"].get<std::string>());
    const std::string expected = c["text"].get<std::string>();
    for (size_t split = 0; split <= bytes.size(); ++split) {
      std::string pending = bytes.substr(0, split);
      std::string out;
      size_t used = append_lossy_utf8(pending, out, false);
      EXPECT_EQ(find_invalid_utf8(out), std::string_view::npos);
      pending = pending.substr(used) + bytes.substr(split);
      used = append_lossy_utf8(pending, out, false);
      pending = pending.substr(used);
      append_lossy_utf8(pending, out, true);
      ASSERT_EQ(out, expected) << "bytes " << c["bytes"] << " split at " << split;
    }
  }
}

TEST(Utf8, CodePointRoundTrip) {
  for (char32_t cp :
       {0x0u, 0x41u, 0x7Fu, 0x80u, 0x7FFu, 0x800u, 0xD7FFu, 0xE000u, 0xFFFDu, 0xFFFFu, 0x10000u, 0x10FFFFu}) {
    std::string s;
    append_utf8(s, cp);
    EXPECT_EQ(find_invalid_utf8(s), std::string_view::npos);
    size_t i = 0;
    EXPECT_EQ(next_code_point(s, i), cp);
    EXPECT_EQ(i, s.size());
  }
}

TEST(ByteLevel, AlphabetIsABijectionThatKeepsPrintableBytes) {
  const auto& a = byte_level_alphabet();
  std::set<char32_t> seen;
  for (int b = 0; b < 256; ++b) {
    seen.insert(a.byte_to_cp[b]);
    if (b >= '!' && b <= '~') {
      EXPECT_EQ(a.byte_to_cp[b], static_cast<char32_t>(b));
    }
    std::string decoded;
    byte_level_decode_token(a.byte_to_utf8[b], decoded);
    ASSERT_EQ(decoded, std::string(1, static_cast<char>(b)));
  }
  EXPECT_EQ(seen.size(), 256u);
  EXPECT_EQ(a.byte_to_cp[' '], 0x120u);   // 'Ġ', as in every GPT-2-style vocabulary
  EXPECT_EQ(a.byte_to_cp['\n'], 0x10Au);  // 'Ċ'
  // A token with a character outside the alphabet is taken verbatim (HF ByteLevel decoder).
  std::string out;
  byte_level_decode_token("<tool call>", out);
  EXPECT_EQ(out, "<tool call>");
}

}  // namespace
}  // namespace pd::tok
