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

// How the output of a chat turn is parsed: tool calls are looked for when the prompt offers tools and
// tool_choice is not none.
ParseOptions parse_options(const ChatPrompt& prompt);
// parallel_tool_calls = false: the client handles one call per turn, so only the first is kept.
ParsedOutput limit_calls(bool parallel_tool_calls, ParsedOutput parsed);

}  // namespace pd::server
