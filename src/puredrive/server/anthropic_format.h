// Anthropic Messages API objects: the message, its content blocks (thinking, text, tool_use), usage, stop
// reasons, the stream events, and errors ({"type": "error", "error": {"type", "message"}}). Pure functions
// of their inputs, and one class that turns successive parses of the growing turn into stream events.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "puredrive/server/api_error.h"
#include "puredrive/server/chat_delta.h"
#include "puredrive/server/openai_format.h"

namespace pd::server {

// Ordered, so that objects keep Anthropic's field order and tool inputs the order the model wrote.
using OJson = nlohmann::ordered_json;

// The routes that answer in Anthropic's shapes, errors included: /v1/messages and below.
bool anthropic_endpoint(std::string_view endpoint);

// Anthropic's status for an error: a full queue is 529 (overloaded), everything else keeps its status.
int anthropic_status(const ApiError& e);
// {"type": "error", "error": {"type": <by status: invalid_request_error, authentication_error,
// permission_error, not_found_error, request_too_large, rate_limit_error, api_error, overloaded_error>,
// "message": ...}}.
OJson anthropic_error_json(const ApiError& e);

// stop_reason of a finished generation: "max_tokens" (the request's max_tokens),
// "model_context_window_exceeded" (the context ran out first), "stop_sequence", "tool_use" or "end_turn".
const char* anthropic_stop_reason(const GenerationResult& result, bool has_tool_calls, bool context_bound);

// input_tokens (prompt tokens not read from a prefix cache), output_tokens, cache_read_input_tokens,
// cache_creation_input_tokens.
OJson anthropic_usage_json(const GenerationStats& stats);

// Content blocks of a finished turn, in the order thinking, text, tool_use. tool_use_ids: one per call.
OJson message_content_json(const ParsedOutput& parsed, const std::vector<std::string>& tool_use_ids);

struct MessageMeta {
  std::string id;  // "msg_..."
  std::string model;
};

OJson message_json(const MessageMeta& meta, const OJson& content, const char* stop_reason,
                   const std::optional<std::string>& stop_sequence, const GenerationStats& stats);

// Stream events. Each is an object whose "type" is also the SSE event name.
OJson message_start_event(const MessageMeta& meta, int32_t prompt_tokens);
OJson message_delta_event(const char* stop_reason, const std::optional<std::string>& stop_sequence,
                          const GenerationStats& stats);
OJson message_stop_event();
OJson ping_event();
// "event: <type>\ndata: <json>\n\n".
std::string sse_event(const OJson& event);
// JSON text, invalid UTF-8 replaced (as dump_json of openai_format.h).
std::string dump_json(const OJson& j);

// Streaming: turns successive parses of the growing turn (TurnParser results, which only grow) into
// content_block_start / content_block_delta / content_block_stop events. Blocks open in the order the
// model writes (thinking, text, tool_use); a kind that resumes after another opens a new block.
class MessageEventBuilder {
 public:
  std::vector<OJson> update(const ParsedOutput& parsed);
  // The content_block_stop of the last open block.
  std::vector<OJson> finish();

 private:
  enum class Block { kNone, kThinking, kText, kToolUse };
  void open(Block kind, OJson content_block, std::vector<OJson>& out);
  void close(std::vector<OJson>& out);

  ChatDeltaBuilder deltas_{"toolu_"};
  Block open_ = Block::kNone;
  int next_index_ = 0;
  std::vector<int> call_blocks_;  // block index of each tool call
};

}  // namespace pd::server
