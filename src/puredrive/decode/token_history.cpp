#include "puredrive/decode/token_history.h"

#include "puredrive/util/status.h"

namespace pd {

TokenHistory::TokenHistory(int32_t vocab_size)
    : output_count_(vocab_size, 0), in_prompt_(vocab_size, 0), seen_index_(vocab_size, -1) {}

void TokenHistory::add_prompt(std::span<const int32_t> tokens) {
  for (int32_t t : tokens) {
    PD_ASSERT(t >= 0 && t < vocab_size(), "prompt token {} outside the vocabulary [0, {})", t, vocab_size());
    in_prompt_[t] = 1;
    mark_seen(t);
  }
}

void TokenHistory::push(int32_t token) {
  PD_ASSERT(token >= 0 && token < vocab_size(), "token {} outside the vocabulary [0, {})", token,
            vocab_size());
  ++output_count_[token];
  mark_seen(token);
}

void TokenHistory::pop(int32_t token) {
  PD_ASSERT(token >= 0 && token < vocab_size() && output_count_[token] > 0, "pop of token {} never pushed",
            token);
  --output_count_[token];
  maybe_unsee(token);
}

void TokenHistory::mark_seen(int32_t token) {
  if (seen_index_[token] >= 0) return;
  seen_index_[token] = static_cast<int32_t>(seen_.size());
  seen_.push_back(token);
}

void TokenHistory::maybe_unsee(int32_t token) {
  if (seen(token)) return;
  const int32_t i = seen_index_[token];
  const int32_t last = seen_.back();
  seen_[i] = last;
  seen_index_[last] = i;
  seen_.pop_back();
  seen_index_[token] = -1;
}

}  // namespace pd
