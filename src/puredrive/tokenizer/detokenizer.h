// StreamingDetokenizer: turns token ids, fed one at a time, into text as soon as it is final. The
// concatenation of everything it returns equals Tokenizer::decode of all the ids: complete UTF-8
// characters are emitted at once, a token that ends inside a character is held until the character
// completes, bytes that can never form a character become U+FFFD immediately, and finish() turns an
// unfinished trailing character into U+FFFD.
#pragma once

#include <cstdint>
#include <string>

#include "puredrive/tokenizer/tokenizer.h"

namespace pd {

class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(Tokenizer tokenizer, bool skip_special_tokens = false)
      : tokenizer_(std::move(tokenizer)), skip_special_tokens_(skip_special_tokens) {}

  // Text made final by this token (possibly empty).
  std::string push(int32_t id);
  // Appending variant for hot loops.
  void push(int32_t id, std::string& out);
  // End of the stream: releases held bytes (as U+FFFD) and resets.
  std::string finish();
  void reset() { pending_.clear(); }
  // Bytes held back, waiting for the rest of a character.
  size_t pending_bytes() const { return pending_.size(); }

 private:
  Tokenizer tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;
};

}  // namespace pd
