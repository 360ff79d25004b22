// UTF-8 helpers shared by the tokenizer pipeline and the streaming detokenizer. Invalid input follows
// the "maximal subpart" rule (one U+FFFD per maximal prefix of a well-formed sequence), the rule of
// Rust's String::from_utf8_lossy and Python's bytes.decode(errors="replace") that HF decode uses.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "puredrive/util/utf8.h"

namespace pd::tok {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Byte offset of the first byte that is not part of a well-formed sequence, or npos when s is valid.
size_t find_invalid_utf8(std::string_view s);

// Decodes the code point at s[i] (s must be valid UTF-8 there) and advances i past it.
char32_t next_code_point(std::string_view s, size_t& i);

using pd::append_utf8;

// Appends the lossy decoding of `in` to `out` and returns how many input bytes were consumed. Unless
// `final`, a trailing proper prefix of a well-formed sequence is left unconsumed (it may still be
// completed); with `final` it becomes one U+FFFD. Decoding a buffer in pieces this way yields the
// same text as decoding it at once.
size_t append_lossy_utf8(std::string_view in, std::string& out, bool final);

inline std::string lossy_utf8(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  append_lossy_utf8(in, out, /*final=*/true);
  return out;
}

}  // namespace pd::tok
