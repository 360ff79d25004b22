// SamplingParams: the typed, validated sampling settings of one request. The server translates the
// OpenAI request into this struct (and applies OpenAI's own ranges there); everything below the server
// takes a SamplingParams that passed validate().
//
// The order in which the sampler applies them follows vLLM's v1 sampler (see sampler.h):
// logit_bias -> repetition -> frequency/presence -> temperature -> min_p -> top_k -> top_p.
#pragma once

#include <cstdint>
#include <map>
#include <optional>

#include "puredrive/util/status.h"

namespace pd {

struct SamplingParams {
  static constexpr int kMaxTopLogprobs = 20;  // OpenAI's limit for top_logprobs
  static constexpr float kMaxLogitBias = 100.0f;

  float temperature = 1.0f;             // 0: greedy (argmax, lowest id on ties); otherwise > 0
  int32_t top_k = 0;                    // 0: off; otherwise keep the k most likely tokens
  float top_p = 1.0f;                   // (0, 1]; 1: off
  float min_p = 0.0f;                   // [0, 1]; 0: off; drop tokens with p < min_p * p_max
  float presence_penalty = 0.0f;        // subtracted once from the logit of every token already generated
  float frequency_penalty = 0.0f;       // subtracted per occurrence in the generated tokens
  float repetition_penalty = 1.0f;      // > 0; 1: off; HF/CTRL rule on prompt + generated tokens
  std::map<int32_t, float> logit_bias;  // token id -> added to its logit, in [-100, 100]
  std::optional<uint64_t> seed;         // set: the seeded exact mode (Gumbel noise keyed by position)
  bool logprobs = false;                // return the sampled token's logprob
  int32_t top_logprobs = 0;             // and the n most likely tokens' logprobs, 0..kMaxTopLogprobs

  bool is_greedy() const { return temperature == 0.0f; }
  bool has_penalties() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f;
  }

  // vocab_size bounds the token ids of logit_bias. Messages name the field, the allowed range and the
  // value found, e.g. "top_p must be in (0, 1], got 1.5".
  Status validate(int32_t vocab_size) const;
};

}  // namespace pd
