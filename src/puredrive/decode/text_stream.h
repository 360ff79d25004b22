// TextStream: generated token ids -> the text a user may see now. Joins the streaming detokenizer (UTF-8
// characters split across tokens are held until complete) and the stop-string matcher (text that may be
// the beginning of a stop string is held until resolved, and nothing from a stop string on is shown).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "puredrive/tokenizer/detokenizer.h"
#include "puredrive/tokenizer/stop_strings.h"
#include "puredrive/tokenizer/tokenizer.h"

namespace pd {

class TextStream {
 public:
  TextStream(Tokenizer tokenizer, std::vector<std::string> stop_strings, bool skip_special_tokens = false)
      : detok_(std::move(tokenizer), skip_special_tokens), stops_(std::move(stop_strings)) {}

  struct Piece {
    std::string text;      // final text, safe to show
    bool stopped = false;  // a stop string matched: text ends before it, and no more text follows
  };

  // Feeds generated tokens (without a final stop token, whose text is never shown).
  Piece push(std::span<const int32_t> ids);
  // End of generation: releases what is held (an unfinished character becomes U+FFFD).
  std::string finish();
  bool stopped() const { return stops_.stopped(); }

 private:
  StreamingDetokenizer detok_;
  StopStringMatcher stops_;
  std::string scratch_;
};

}  // namespace pd
