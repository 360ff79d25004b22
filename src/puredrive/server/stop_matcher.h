// Stop strings on streamed engine outputs. The matching itself is tokenizer/'s StopStringMatcher (text that
// may still start a stop string is held back; nothing of a stop string, nor anything after it, is released:
// OpenAI semantics); this adds the engine outputs' token ids and logprobs, which travel with their text.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "puredrive/server/engine_port.h"
#include "puredrive/tokenizer/stop_strings.h"

namespace pd::server {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // Feeds one engine output; returns what can be released now (possibly nothing). Token ids and logprobs
  // travel with the text of the output they came in.
  std::vector<GenerationOutput> push(GenerationOutput output);
  // End of generation without a match: releases everything still held.
  std::vector<GenerationOutput> flush();
  bool matched() const { return text_.stopped(); }
  // The stop string that matched; empty while none did.
  const std::string& matched_string() const { return matched_; }

 private:
  // Releases the first n bytes of the pending text (and the tokens of the outputs that start there).
  std::vector<GenerationOutput> release(size_t n);

  StopStringMatcher text_;
  std::vector<std::string> stops_;
  std::string matched_;
  // The outputs whose text the matcher still holds (their texts, joined, are the held text).
  std::deque<GenerationOutput> pending_;
};

}  // namespace pd::server
