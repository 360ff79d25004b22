#include "puredrive/server/openai_format.h"

#include <random>

namespace pd::server {

std::string new_id(std::string_view prefix) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, sizeof(kAlphabet) - 2);
  std::string id(prefix);
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(rng)];
  return id;
}

std::string dump_json(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

Json usage_json(const GenerationStats& stats) {
  return Json{{"prompt_tokens", stats.prompt_tokens},
              {"completion_tokens", stats.completion_tokens},
              {"total_tokens", stats.prompt_tokens + stats.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", stats.cached_prompt_tokens}}}};
}

Json puredrive_stats_json(const GenerationStats& s) {
  Json per_position = Json::array();
  for (size_t j = 0; j < s.proposed_at.size(); ++j) {
    const int64_t accepted = j < s.accepted_at.size() ? s.accepted_at[j] : 0;
    per_position.push_back(s.proposed_at[j] > 0 ? static_cast<double>(accepted) / s.proposed_at[j] : 0.0);
  }
  const int32_t computed = s.prompt_tokens - s.cached_prompt_tokens;
  return Json{{"prefill_seconds", s.prefill_seconds},
              {"prefill_tokens_per_second", s.prefill_seconds > 0 ? computed / s.prefill_seconds : 0.0},
              {"decode_seconds", s.decode_seconds},
              {"decode_tokens_per_second", s.decode_tokens_per_second()},
              {"decode_steps", s.decode_steps},
              {"draft_tokens", s.draft_tokens},
              {"accepted_draft_tokens", s.accepted_draft_tokens},
              {"tokens_per_step", s.tokens_per_step()},
              {"acceptance_per_position", per_position}};
}

namespace {

Json bytes_json(const std::string& s) {
  Json b = Json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

}  // namespace

Json chat_logprob_entries(const std::vector<TokenLogprob>& logprobs) {
  Json content = Json::array();
  for (const auto& lp : logprobs) {
    Json top = Json::array();
    for (const auto& t : lp.top) {
      top.push_back({{"token", t.token}, {"logprob", t.logprob}, {"bytes", bytes_json(t.token)}});
    }
    content.push_back({{"token", lp.token},
                       {"logprob", lp.logprob},
                       {"bytes", bytes_json(lp.token)},
                       {"top_logprobs", top}});
  }
  return content;
}

Json completion_logprobs(const std::vector<TokenLogprob>& logprobs, size_t text_offset) {
  Json tokens = Json::array(), token_logprobs = Json::array(), top = Json::array(), offsets = Json::array();
  for (const auto& lp : logprobs) {
    tokens.push_back(lp.token);
    token_logprobs.push_back(lp.logprob);
    Json alternatives = Json::object();
    for (const auto& t : lp.top) alternatives[t.token] = t.logprob;
    top.push_back(alternatives);
    offsets.push_back(text_offset);
    text_offset += lp.token.size();
  }
  return Json{{"tokens", tokens},
              {"token_logprobs", token_logprobs},
              {"top_logprobs", top},
              {"text_offset", offsets}};
}

const char* openai_finish_reason(FinishReason reason, bool has_tool_calls) {
  if (reason == FinishReason::kLength || reason == FinishReason::kContextFull) return "length";
  return has_tool_calls ? "tool_calls" : "stop";
}

Json chat_message_json(const ParsedOutput& parsed, const std::vector<std::string>& tool_call_ids) {
  Json m{{"role", "assistant"}};
  const bool calls = !parsed.tool_calls.empty();
  // OpenAI sends null content for a turn that only calls tools.
  m["content"] = (calls && parsed.content.empty()) ? Json(nullptr) : Json(parsed.content);
  m["refusal"] = nullptr;
  if (!parsed.reasoning_content.empty()) m["reasoning_content"] = parsed.reasoning_content;
  if (calls) {
    Json list = Json::array();
    for (size_t i = 0; i < parsed.tool_calls.size(); ++i) {
      list.push_back(
          {{"id", tool_call_ids.at(i)},
           {"type", "function"},
           {"function",
            {{"name", parsed.tool_calls[i].name}, {"arguments", parsed.tool_calls[i].arguments}}}});
    }
    m["tool_calls"] = list;
  }
  return m;
}

namespace {

Json base(const ResponseMeta& meta, const char* object) {
  return Json{{"id", meta.id},
              {"object", object},
              {"created", meta.created},
              {"model", meta.model},
              {"system_fingerprint", meta.system_fingerprint}};
}

Json reason_json(const char* finish_reason) {
  return finish_reason ? Json(finish_reason) : Json(nullptr);
}

}  // namespace

Json chat_completion_json(const ResponseMeta& meta, const Json& message, const char* finish_reason,
                          const std::optional<Json>& logprobs, const GenerationStats& stats) {
  Json j = base(meta, "chat.completion");
  j["choices"] = Json::array({{{"index", 0},
                               {"message", message},
                               {"logprobs", logprobs ? *logprobs : Json(nullptr)},
                               {"finish_reason", reason_json(finish_reason)}}});
  j["usage"] = usage_json(stats);
  j["puredrive"] = puredrive_stats_json(stats);
  return j;
}

Json chat_chunk_json(const ResponseMeta& meta, const Json& delta, const char* finish_reason,
                     const std::optional<Json>& logprobs, bool usage_null) {
  Json j = base(meta, "chat.completion.chunk");
  j["choices"] = Json::array({{{"index", 0},
                               {"delta", delta},
                               {"logprobs", logprobs ? *logprobs : Json(nullptr)},
                               {"finish_reason", reason_json(finish_reason)}}});
  if (usage_null) j["usage"] = nullptr;
  return j;
}

Json usage_chunk_json(const ResponseMeta& meta, const char* object, const GenerationStats& stats) {
  Json j = base(meta, object);
  j["choices"] = Json::array();
  j["usage"] = usage_json(stats);
  j["puredrive"] = puredrive_stats_json(stats);
  return j;
}

Json completion_json(const ResponseMeta& meta, const std::string& text, const char* finish_reason,
                     const std::optional<Json>& logprobs, const GenerationStats& stats) {
  Json j = base(meta, "text_completion");
  j["choices"] = Json::array({{{"index", 0},
                               {"text", text},
                               {"logprobs", logprobs ? *logprobs : Json(nullptr)},
                               {"finish_reason", reason_json(finish_reason)}}});
  j["usage"] = usage_json(stats);
  j["puredrive"] = puredrive_stats_json(stats);
  return j;
}

Json completion_chunk_json(const ResponseMeta& meta, const std::string& text, const char* finish_reason,
                           const std::optional<Json>& logprobs, bool usage_null) {
  Json j = base(meta, "text_completion");
  j["choices"] = Json::array({{{"index", 0},
                               {"text", text},
                               {"logprobs", logprobs ? *logprobs : Json(nullptr)},
                               {"finish_reason", reason_json(finish_reason)}}});
  if (usage_null) j["usage"] = nullptr;
  return j;
}

std::string sse_data(const Json& j) {
  return "data: " + dump_json(j) + "\n\n";
}
std::string sse_done() {
  return "data: [DONE]\n\n";
}
std::string sse_comment(std::string_view text) {
  return ": " + std::string(text) + "\n\n";
}

}  // namespace pd::server
