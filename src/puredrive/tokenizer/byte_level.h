// GPT-2's byte-level alphabet: a reversible map from the 256 byte values to printable code points, so
// that any byte string becomes a string of vocabulary characters.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace pd::tok {

struct ByteLevelAlphabet {
  std::array<char32_t, 256> byte_to_cp{};
  std::array<std::string, 256> byte_to_utf8{};   // byte_to_cp, UTF-8 encoded
  static constexpr char32_t kMaxCp = 0x143;      // largest code point of the alphabet
  std::array<int16_t, kMaxCp + 1> cp_to_byte{};  // -1 where a code point is not in the alphabet
};

const ByteLevelAlphabet& byte_level_alphabet();

// Appends the byte-level image of every byte of `in`.
void byte_level_encode(std::string_view in, std::string& out);

// Appends the bytes a token stands for. As in HF's ByteLevel decoder, a token with any character
// outside the alphabet (an added token such as "<tool call>") is taken verbatim.
void byte_level_decode_token(std::string_view token, std::string& out);

}  // namespace pd::tok
