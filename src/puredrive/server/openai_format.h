// OpenAI response objects: chat.completion, chat.completion.chunk, text_completion, usage and logprobs,
// plus the SSE framing of a stream. Pure functions of their inputs, so tests can check the exact shapes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "puredrive/server/engine_port.h"
#include "puredrive/server/frontend.h"

namespace pd::server {

using Json = nlohmann::json;

// "chatcmpl-" / "cmpl-" / "call_" followed by 24 random alphanumerics.
std::string new_id(std::string_view prefix);

// JSON text; invalid UTF-8 (only possible in logprob token pieces) becomes U+FFFD instead of throwing.
std::string dump_json(const Json& j);

// Identity of one response, repeated in every chunk of a stream.
struct ResponseMeta {
  std::string id;
  int64_t created = 0;  // Unix seconds
  std::string model;
  std::string system_fingerprint;
};

Json usage_json(const GenerationStats& stats);
// PureDrive's own figures of a generation, sent as "puredrive" beside "usage" (which keeps OpenAI's shape)
// in every object that carries usage: prefill and decode speed, tokens per MTP cycle, acceptance per draft
// position. Clients that do not know the field ignore it.
Json puredrive_stats_json(const GenerationStats& stats);

// chat: {"token", "logprob", "bytes", "top_logprobs": [...]} per token.
Json chat_logprob_entries(const std::vector<TokenLogprob>& logprobs);
// completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}; offsets start at text_offset.
Json completion_logprobs(const std::vector<TokenLogprob>& logprobs, size_t text_offset);

// "stop" | "length" | "tool_calls"; kCancelled / kError have no OpenAI reason and map to "stop".
const char* openai_finish_reason(FinishReason reason, bool has_tool_calls);

// The assistant message of a non-streaming chat response. tool_call_ids: one per parsed call.
Json chat_message_json(const ParsedOutput& parsed, const std::vector<std::string>& tool_call_ids);

Json chat_completion_json(const ResponseMeta& meta, const Json& message, const char* finish_reason,
                          const std::optional<Json>& logprobs, const GenerationStats& stats);
// One streaming chunk with one choice. finish_reason null while streaming; usage_null adds "usage": null
// (what OpenAI sends in every chunk when stream_options.include_usage is set).
Json chat_chunk_json(const ResponseMeta& meta, const Json& delta, const char* finish_reason,
                     const std::optional<Json>& logprobs, bool usage_null);
// The usage chunk that ends a stream with include_usage: "choices": [].
Json usage_chunk_json(const ResponseMeta& meta, const char* object, const GenerationStats& stats);

Json completion_json(const ResponseMeta& meta, const std::string& text, const char* finish_reason,
                     const std::optional<Json>& logprobs, const GenerationStats& stats);
Json completion_chunk_json(const ResponseMeta& meta, const std::string& text, const char* finish_reason,
                           const std::optional<Json>& logprobs, bool usage_null);

// Server-sent events framing.
std::string sse_data(const Json& j);        // "data: {...}\n\n"
std::string sse_done();                     // "data: [DONE]\n\n"
std::string sse_comment(std::string_view);  // ": text\n\n" (ignored by clients; keeps idle connections open)

}  // namespace pd::server
