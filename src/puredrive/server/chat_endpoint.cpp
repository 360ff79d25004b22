// POST /v1/chat/completions, streaming and not.
#include <memory>

#include "puredrive/server/api_service.h"
#include "puredrive/server/chat_delta.h"
#include "puredrive/server/stream_writer.h"

namespace pd::server {
namespace {

constexpr std::string_view kChatEndpoint = "/v1/chat/completions";

ParsedOutput limit_calls(const ChatRequest& req, ParsedOutput parsed) {
  return limit_calls(req.parallel_tool_calls, std::move(parsed));
}

std::optional<Json> chat_logprobs(const ChatRequest& req, const std::vector<TokenLogprob>& lps) {
  if (!req.logprobs) return std::nullopt;
  return Json{{"content", chat_logprob_entries(lps)}, {"refusal", nullptr}};
}

}  // namespace

Reply ApiService::chat_completions(std::string_view body, ClientConnection& client) {
  ChatRequest req;
  if (auto err = parse_chat_request(body, limits_, &req)) return error(*err, kChatEndpoint);
  const std::string id = new_id("chatcmpl-");
  auto rendered = render_prompt(req.prompt, kChatEndpoint, id);
  if (auto* reply = std::get_if<Reply>(&rendered)) return std::move(*reply);
  auto prompt = std::get<PromptTokens>(std::move(rendered));

  GenerationRequest g;
  g.id = id;
  g.prompt_ids = prompt.ids;
  g.sampling = req.common.sampling;
  g.logprobs = req.logprobs ? req.top_logprobs : -1;
  g.mtp = req.common.mtp;
  auto admitted = admit(std::move(g), req.common.stop, req.common.max_tokens, kChatEndpoint);
  if (auto* reply = std::get_if<Reply>(&admitted)) return std::move(*reply);
  Admitted a = std::get<Admitted>(std::move(admitted));
  if (req.common.stream) return stream_chat(std::move(a), std::move(req), std::move(prompt));

  auto collected = collect(a, client);
  if (!collected) return client_gone_reply();
  const GenerationResult& r = collected->result;
  if (r.reason == FinishReason::kError || r.reason == FinishReason::kCancelled) return engine_failure(a, r);

  auto turn = frontend_.parser->start_turn(parse_options(req.prompt), prompt);
  turn->feed(collected->text);
  const ParsedOutput parsed = limit_calls(req, turn->finish());
  std::vector<std::string> call_ids;
  for (size_t i = 0; i < parsed.tool_calls.size(); ++i) call_ids.push_back(new_id("call_"));
  const Json body_json = chat_completion_json(a.meta, chat_message_json(parsed, call_ids),
                                              openai_finish_reason(r.reason, !parsed.tool_calls.empty()),
                                              chat_logprobs(req, collected->logprobs), r.stats);
  log_finished(a, 200, r, "");
  return ok_json_reply(dump_json(body_json));
}

Reply ApiService::stream_chat(Admitted admitted, ChatRequest request, PromptTokens prompt_tokens) {
  struct State {
    Admitted a;
    ChatRequest req;
    PromptTokens prompt;
  };
  auto st = std::make_shared<State>(State{std::move(admitted), std::move(request), std::move(prompt_tokens)});
  return event_stream_reply([this, st](ClientConnection& client) {
    Admitted& a = st->a;
    const ChatRequest& req = st->req;
    const bool usage = req.common.include_usage;
    StreamWriter w(client);
    w.data(
        chat_chunk_json(a.meta, Json{{"role", "assistant"}, {"content", ""}}, nullptr, std::nullopt, usage));

    ChatDeltaBuilder deltas;
    auto turn = frontend_.parser->start_turn(parse_options(req.prompt), st->prompt);
    std::vector<TokenLogprob> pending_logprobs;  // sent with the next chunk
    auto send = [&](const ParsedOutput& parsed) {
      for (const Json& d : deltas.update(parsed)) {
        std::optional<Json> lp;
        if (req.logprobs && !pending_logprobs.empty()) {
          lp = chat_logprobs(req, pending_logprobs);
          pending_logprobs.clear();
        }
        if (!w.data(chat_chunk_json(a.meta, d, nullptr, lp, usage))) return false;
      }
      return true;
    };
    auto result = pump(a, w, [&](GenerationOutput& out) {
      for (auto& lp : out.logprobs) pending_logprobs.push_back(std::move(lp));
      return send(limit_calls(req, turn->feed(out.text)));
    });
    if (!result) return;
    if (result->reason == FinishReason::kError || result->reason == FinishReason::kCancelled) {
      const Reply err = engine_failure(a, *result);
      w.raw("data: " + err.body + "\n\n");
      w.raw(sse_done());
      return;
    }
    const ParsedOutput final_parse = limit_calls(req, turn->finish());
    send(final_parse);
    const bool calls = !final_parse.tool_calls.empty();
    std::optional<Json> lp;
    if (req.logprobs && !pending_logprobs.empty()) lp = chat_logprobs(req, pending_logprobs);
    w.data(chat_chunk_json(a.meta, Json::object(), openai_finish_reason(result->reason, calls), lp, usage));
    if (usage) w.data(usage_chunk_json(a.meta, "chat.completion.chunk", result->stats));
    w.raw(sse_done());
    log_finished(a, 200, *result, w.failed() ? "client disconnected at the end" : "");
  });
}

}  // namespace pd::server
