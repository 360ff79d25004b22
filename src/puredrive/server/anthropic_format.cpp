#include "puredrive/server/anthropic_format.h"

namespace pd::server {
namespace {

const char* error_type(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 503:
    case 529:
      return "overloaded_error";
    default:
      return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

// The parser only reports calls whose arguments are a JSON object; anything else would be a bug upstream,
// and an empty input is the least surprising stand-in.
OJson tool_input(const std::string& arguments) {
  OJson input = OJson::parse(arguments, nullptr, false);
  return input.is_object() ? input : OJson::object();
}

OJson optional_string(const std::optional<std::string>& s) {
  return s ? OJson(*s) : OJson(nullptr);
}

OJson block_event(const char* type, int index) {
  return OJson{{"type", type}, {"index", index}};
}

}  // namespace

bool anthropic_endpoint(std::string_view endpoint) {
  constexpr std::string_view kPrefix = "/v1/messages";
  return endpoint.substr(0, kPrefix.size()) == kPrefix &&
         (endpoint.size() == kPrefix.size() || endpoint[kPrefix.size()] == '/');
}

int anthropic_status(const ApiError& e) {
  return e.code == "queue_full" ? 529 : e.status;
}

OJson anthropic_error_json(const ApiError& e) {
  return OJson{{"type", "error"},
               {"error", {{"type", error_type(anthropic_status(e))}, {"message", e.message}}}};
}

const char* anthropic_stop_reason(const GenerationResult& result, bool has_tool_calls, bool context_bound) {
  if (result.reason == FinishReason::kContextFull) return "model_context_window_exceeded";
  if (result.reason == FinishReason::kLength)
    return context_bound ? "model_context_window_exceeded" : "max_tokens";
  if (result.stop_string) return "stop_sequence";
  return has_tool_calls ? "tool_use" : "end_turn";
}

OJson anthropic_usage_json(const GenerationStats& stats) {
  return OJson{{"input_tokens", stats.prompt_tokens - stats.cached_prompt_tokens},
               {"output_tokens", stats.completion_tokens},
               {"cache_read_input_tokens", stats.cached_prompt_tokens},
               {"cache_creation_input_tokens", 0}};
}

OJson message_content_json(const ParsedOutput& parsed, const std::vector<std::string>& tool_use_ids) {
  OJson blocks = OJson::array();
  // The signature proves to Anthropic that it wrote the thinking; there is nothing to prove here, and
  // clients send it back unread.
  if (!parsed.reasoning_content.empty()) {
    blocks.push_back({{"type", "thinking"}, {"thinking", parsed.reasoning_content}, {"signature", ""}});
  }
  if (!parsed.content.empty()) blocks.push_back({{"type", "text"}, {"text", parsed.content}});
  for (size_t i = 0; i < parsed.tool_calls.size(); ++i) {
    blocks.push_back({{"type", "tool_use"},
                      {"id", tool_use_ids.at(i)},
                      {"name", parsed.tool_calls[i].name},
                      {"input", tool_input(parsed.tool_calls[i].arguments)}});
  }
  return blocks;
}

OJson message_json(const MessageMeta& meta, const OJson& content, const char* stop_reason,
                   const std::optional<std::string>& stop_sequence, const GenerationStats& stats) {
  return OJson{{"id", meta.id},
               {"type", "message"},
               {"role", "assistant"},
               {"model", meta.model},
               {"content", content},
               {"stop_reason", stop_reason ? OJson(stop_reason) : OJson(nullptr)},
               {"stop_sequence", optional_string(stop_sequence)},
               {"usage", anthropic_usage_json(stats)}};
}

OJson message_start_event(const MessageMeta& meta, int32_t prompt_tokens) {
  GenerationStats start;
  start.prompt_tokens = prompt_tokens;
  return OJson{{"type", "message_start"},
               {"message", message_json(meta, OJson::array(), nullptr, std::nullopt, start)}};
}

OJson message_delta_event(const char* stop_reason, const std::optional<std::string>& stop_sequence,
                          const GenerationStats& stats) {
  return OJson{{"type", "message_delta"},
               {"delta", {{"stop_reason", stop_reason}, {"stop_sequence", optional_string(stop_sequence)}}},
               {"usage", anthropic_usage_json(stats)}};
}

OJson message_stop_event() {
  return OJson{{"type", "message_stop"}};
}

OJson ping_event() {
  return OJson{{"type", "ping"}};
}

std::string sse_event(const OJson& event) {
  return "event: " + event.value("type", std::string("message")) + "\ndata: " + dump_json(event) + "\n\n";
}

std::string dump_json(const OJson& j) {
  return j.dump(-1, ' ', false, OJson::error_handler_t::replace);
}

void MessageEventBuilder::open(Block kind, OJson content_block, std::vector<OJson>& out) {
  close(out);
  OJson e = block_event("content_block_start", next_index_);
  e["content_block"] = std::move(content_block);
  out.push_back(std::move(e));
  open_ = kind;
  ++next_index_;
}

void MessageEventBuilder::close(std::vector<OJson>& out) {
  if (open_ == Block::kNone) return;
  out.push_back(block_event("content_block_stop", next_index_ - 1));
  open_ = Block::kNone;
}

std::vector<OJson> MessageEventBuilder::update(const ParsedOutput& parsed) {
  std::vector<OJson> out;
  auto delta = [&](int index, OJson d) {
    OJson e = block_event("content_block_delta", index);
    e["delta"] = std::move(d);
    out.push_back(std::move(e));
  };
  // The OpenAI deltas already say what grew, in order; only their shape changes.
  for (const Json& d : deltas_.update(parsed)) {
    if (d.contains("reasoning_content")) {
      if (open_ != Block::kThinking)
        open(Block::kThinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}, out);
      delta(next_index_ - 1,
            {{"type", "thinking_delta"}, {"thinking", d["reasoning_content"].get<std::string>()}});
    } else if (d.contains("content")) {
      if (open_ != Block::kText) open(Block::kText, {{"type", "text"}, {"text", ""}}, out);
      delta(next_index_ - 1, {{"type", "text_delta"}, {"text", d["content"].get<std::string>()}});
    } else {
      for (const Json& call : d["tool_calls"]) {
        const Json& fn = call["function"];
        if (call.contains("id")) {
          open(Block::kToolUse,
               {{"type", "tool_use"},
                {"id", call["id"].get<std::string>()},
                {"name", fn["name"].get<std::string>()},
                {"input", OJson::object()}},
               out);
          call_blocks_.push_back(next_index_ - 1);
        }
        // Arguments of a call arrive in its own block, even if another block opened in between.
        const std::string args = fn.value("arguments", std::string());
        if (!args.empty()) {
          delta(call_blocks_.at(call["index"].get<size_t>()),
                {{"type", "input_json_delta"}, {"partial_json", args}});
        }
      }
    }
  }
  return out;
}

std::vector<OJson> MessageEventBuilder::finish() {
  std::vector<OJson> out;
  close(out);
  return out;
}

}  // namespace pd::server
