// Stop strings on streamed text. A stop string may arrive split over several engine outputs, so the text
// that could still be the start of one is held back until the next output decides; nothing of the stop
// string itself, nor anything after it, is released (OpenAI semantics).
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "puredrive/server/engine_port.h"

namespace pd::server {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // Feeds one engine output; returns what can be released now (possibly nothing). Token ids and logprobs
  // travel with the text of the output they came in.
  std::vector<GenerationOutput> push(GenerationOutput output);
  // End of generation without a match: releases everything still held.
  std::vector<GenerationOutput> flush();
  bool matched() const { return matched_; }

 private:
  // Releases the first n bytes of the pending text (and the tokens of the outputs that start there).
  std::vector<GenerationOutput> release(size_t n);
  size_t held_suffix(const std::string& text) const;

  std::vector<std::string> stops_;
  std::deque<GenerationOutput> pending_;
  bool matched_ = false;
};

}  // namespace pd::server
