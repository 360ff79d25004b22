// POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API): the body, parsed and validated
// into the same typed fields as a chat completion, so that one prompt builder, scheduler and output parser
// serve both APIs. The mapping:
//   system (a string or text blocks)          -> a first system message
//   user text blocks                           -> user messages; tool_result blocks -> tool messages
//   assistant text / thinking / tool_use       -> content / reasoning_content / tool_calls
//   tools (name, description, input_schema)    -> function tools rendered by the model's chat template
//   tool_choice auto / any / tool / none       -> auto / required / the named function / none
//   thinking enabled / adaptive / disabled     -> chat template variable enable_thinking true / false
//   stop_sequences, temperature, top_p, top_k  -> stop strings and sampling
// Rejections are ApiErrors with the parameter named as in the request ("messages[1].content[0].type");
// the service renders them in Anthropic's error shape.
#pragma once

#include <optional>
#include <string_view>

#include "puredrive/server/frontend.h"
#include "puredrive/server/request_fields.h"

namespace pd::server {

struct MessagesRequest {
  CommonFields common;  // model, stream, sampling, max_tokens (required), stop (stop_sequences)
  ChatPrompt prompt;
  bool parallel_tool_calls = true;  // false: tool_choice.disable_parallel_tool_use
};

enum class MessagesCall {
  kCreate,       // POST /v1/messages
  kCountTokens,  // POST /v1/messages/count_tokens: no max_tokens, no sampling, no stream
};

inline constexpr size_t kMaxStopSequences = 64;

std::optional<ApiError> parse_messages_request(std::string_view body, const RequestLimits& limits,
                                               MessagesCall call, MessagesRequest* out);

}  // namespace pd::server
