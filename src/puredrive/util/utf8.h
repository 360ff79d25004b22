// The UTF-8 encoder of the tokenizer and the Jinja interpreter, which decode by different rules (lossy
// maximal-subpart vs Python-style byte fallback) but write code points the same way.
#pragma once

#include <string>

namespace pd {

// Appends the UTF-8 encoding of cp (at most 4 bytes; cp is not checked for surrogates or > U+10FFFF).
void append_utf8(std::string& out, char32_t cp);

}  // namespace pd
