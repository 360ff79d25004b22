// POST /v1/chat/completions: the request body, parsed and validated into typed fields. Every rejection is
// an ApiError with OpenAI's status, message and param.
#pragma once

#include <optional>
#include <string_view>

#include "puredrive/server/frontend.h"
#include "puredrive/server/request_fields.h"

namespace pd::server {

struct ChatRequest {
  CommonFields common;
  ChatPrompt prompt;
  bool logprobs = false;
  int32_t top_logprobs = 0;
  bool parallel_tool_calls = true;
};

std::optional<ApiError> parse_chat_request(std::string_view body, const RequestLimits& limits,
                                           ChatRequest* out);

}  // namespace pd::server
