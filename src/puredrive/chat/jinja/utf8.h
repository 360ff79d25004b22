// UTF-8 helpers with Python 3 str semantics: templates index, slice, strip and case-map strings by code
// point, and the reference (Python jinja2) decides what counts as whitespace or printable by Unicode
// category. Strings stay UTF-8 in memory; ASCII-only strings take byte-wise fast paths.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "puredrive/util/utf8.h"

namespace pd::jinja::utf8 {

// Decodes the code point at s[i] and advances i. Invalid bytes decode as themselves (U+0080..U+00FF)
// so that no input is ever dropped.
char32_t decode(std::string_view s, size_t& i);

bool is_ascii(std::string_view s);
size_t length(std::string_view s);  // code points
std::vector<char32_t> to_code_points(std::string_view s);
std::string from_code_points(const char32_t* begin, const char32_t* end);
// Byte offset of code point index `cp_index` (clamped to the end).
size_t byte_offset(std::string_view s, size_t cp_index);

// Python's str.isspace() / str.isprintable() / isalpha / isdigit / isalnum / cased for one code point.
bool is_space(char32_t cp);
bool is_printable(char32_t cp);
bool is_alpha(char32_t cp);
bool is_decimal(char32_t cp);
bool is_alnum(char32_t cp);
bool is_word(char32_t cp);  // Python re \w
bool is_cased(char32_t cp);
bool is_lower(char32_t cp);
bool is_upper(char32_t cp);

// Case mapping. Python uses full case mapping; we use the simple one-to-one mapping plus the common
// one-to-many cases (German sharp s), which covers what chat templates meet in practice.
void append_upper(std::string& out, char32_t cp);
void append_lower(std::string& out, char32_t cp);
void append_title(std::string& out, char32_t cp);
std::string upper(std::string_view s);
std::string lower(std::string_view s);

// Python str.strip/lstrip/rstrip: `chars` empty means whitespace (pass has_chars=false).
std::string_view strip(std::string_view s, bool left, bool right, const std::string* chars);

}  // namespace pd::jinja::utf8
