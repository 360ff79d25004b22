// Regex for pre-tokenizer patterns. tokenizer.json patterns are written for Oniguruma (what HF
// tokenizers uses); they are translated to PCRE2 (JIT, UTF, UCP) with Oniguruma's meaning of \s, \w,
// \d, \h and of Unicode categories, including code points newer than PCRE2's Unicode tables.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "puredrive/util/status.h"

struct pcre2_real_code_8;

namespace pd::tok {

using Span = std::pair<size_t, size_t>;  // [begin, end) byte offsets

class Regex {
 public:
  // Compiles an Oniguruma-syntax pattern. Constructs whose meaning differs between the two engines
  // and that are not translated (\b, nested classes, ...) are rejected with kUnsupported.
  static Expected<std::shared_ptr<const Regex>> compile(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the spans of successive matches, left to right, with Oniguruma's iteration rule for empty
  // matches (one right after the previous match is skipped). `text` must be valid UTF-8.
  Status find_all(std::string_view text, std::vector<Span>& out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  std::string pattern_;  // as given (Oniguruma syntax), for messages
  pcre2_real_code_8* code_ = nullptr;
};

// Exposed for tests: the PCRE2 pattern an Oniguruma pattern is translated to.
Expected<std::string> translate_oniguruma_pattern(std::string_view pattern);

// Rust regex's \w (HF's single_word rule) and Unicode White_Space (HF's lstrip/rstrip/Strip), for one
// code point.
bool is_word_char(char32_t cp);
bool is_white_space(char32_t cp);

}  // namespace pd::tok
