#include "puredrive/decode/sampling_params.h"

#include <cmath>

namespace pd {

Status SamplingParams::validate(int32_t vocab_size) const {
  if (!std::isfinite(temperature) || temperature < 0.0f) {
    return make_error(ErrorCode::kInvalidArgument,
                      "temperature must be a finite number >= 0 (0 = greedy), got {}", temperature);
  }
  if (top_k < 0)
    return make_error(ErrorCode::kInvalidArgument, "top_k must be >= 0 (0 = off), got {}", top_k);
  if (!(top_p > 0.0f && top_p <= 1.0f))
    return make_error(ErrorCode::kInvalidArgument, "top_p must be in (0, 1], got {}", top_p);
  if (!(min_p >= 0.0f && min_p <= 1.0f))
    return make_error(ErrorCode::kInvalidArgument, "min_p must be in [0, 1], got {}", min_p);
  if (!std::isfinite(presence_penalty))
    return make_error(ErrorCode::kInvalidArgument, "presence_penalty must be finite, got {}",
                      presence_penalty);
  if (!std::isfinite(frequency_penalty)) {
    return make_error(ErrorCode::kInvalidArgument, "frequency_penalty must be finite, got {}",
                      frequency_penalty);
  }
  if (!std::isfinite(repetition_penalty) || repetition_penalty <= 0.0f) {
    return make_error(ErrorCode::kInvalidArgument,
                      "repetition_penalty must be a finite number > 0 (1 = off), got {}", repetition_penalty);
  }
  for (const auto& [token, bias] : logit_bias) {
    if (token < 0 || token >= vocab_size) {
      return make_error(ErrorCode::kInvalidArgument, "logit_bias token id {} is out of range [0, {})", token,
                        vocab_size);
    }
    if (!(bias >= -kMaxLogitBias && bias <= kMaxLogitBias)) {
      return make_error(ErrorCode::kInvalidArgument, "logit_bias for token {} must be in [-100, 100], got {}",
                        token, bias);
    }
  }
  if (top_logprobs < 0 || top_logprobs > kMaxTopLogprobs) {
    return make_error(ErrorCode::kInvalidArgument, "top_logprobs must be in [0, {}], got {}", kMaxTopLogprobs,
                      top_logprobs);
  }
  if (top_logprobs > 0 && !logprobs)
    return make_error(ErrorCode::kInvalidArgument, "top_logprobs ({}) requires logprobs = true",
                      top_logprobs);
  return Status::ok();
}

}  // namespace pd
