// POST /v1/completions (the legacy text completion API): the request body, parsed and validated.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "puredrive/server/request_fields.h"

namespace pd::server {

// OpenAI's default for /v1/completions when max_tokens is absent.
inline constexpr int32_t kCompletionDefaultMaxTokens = 16;

struct CompletionRequest {
  CommonFields common;
  std::string prompt_text;          // when the prompt is a string
  std::vector<int32_t> prompt_ids;  // when the prompt is token ids
  bool prompt_is_ids = false;
  bool echo = false;
  int32_t logprobs = -1;  // -1: none; else number of top alternatives per token
};

std::optional<ApiError> parse_completion_request(std::string_view body, const RequestLimits& limits,
                                                 CompletionRequest* out);

}  // namespace pd::server
