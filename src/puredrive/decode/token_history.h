// TokenHistory: what the penalties of SamplingParams look at. The repetition penalty (HF/CTRL) applies to
// every token of the prompt and of the output; presence and frequency penalties (OpenAI) count output
// tokens only, as vLLM does.
//
// Speculative decoding needs the history of each verify row: push d_1..d_j before processing row j, then
// pop the rejected drafts after acceptance. pop() undoes push() exactly, so the penalties of a row never
// depend on whether it was computed in a verify pass or a one-row step.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace pd {

class TokenHistory {
 public:
  explicit TokenHistory(int32_t vocab_size);

  int32_t vocab_size() const { return static_cast<int32_t>(output_count_.size()); }

  void add_prompt(std::span<const int32_t> tokens);
  void push(int32_t token);  // one output token
  void pop(int32_t token);   // undo the latest push of `token`

  int32_t output_count(int32_t token) const { return output_count_[token]; }
  bool in_prompt(int32_t token) const { return in_prompt_[token] != 0; }
  bool seen(int32_t token) const { return in_prompt(token) || output_count(token) > 0; }

  // Distinct tokens of prompt + output, in no particular order: penalties touch only these, not the
  // whole vocabulary.
  std::span<const int32_t> seen_tokens() const { return seen_; }

 private:
  void mark_seen(int32_t token);
  void maybe_unsee(int32_t token);

  std::vector<int32_t> output_count_;  // [V]
  std::vector<uint8_t> in_prompt_;     // [V]
  std::vector<int32_t> seen_;          // distinct ids
  std::vector<int32_t> seen_index_;    // [V] index into seen_, -1 if absent
};

}  // namespace pd
