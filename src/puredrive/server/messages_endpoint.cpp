// POST /v1/messages (streaming and not) and POST /v1/messages/count_tokens: Anthropic's Messages API over the
// same prompt builder, scheduler and output parser as the chat completions.
#include <memory>

#include "puredrive/server/anthropic_format.h"
#include "puredrive/server/api_service.h"
#include "puredrive/server/stream_writer.h"

namespace pd::server {
namespace {

constexpr std::string_view kMessagesEndpoint = "/v1/messages";
constexpr std::string_view kCountEndpoint = "/v1/messages/count_tokens";

MessageMeta message_meta(const ResponseMeta& meta) {
  return MessageMeta{.id = meta.id, .model = meta.model};
}

}  // namespace

Reply ApiService::count_message_tokens(std::string_view body) {
  MessagesRequest req;
  if (auto err = parse_messages_request(body, limits_, MessagesCall::kCountTokens, &req))
    return error(*err, kCountEndpoint);
  auto rendered = render_prompt(req.prompt, kCountEndpoint, "");
  if (auto* reply = std::get_if<Reply>(&rendered)) return std::move(*reply);
  const auto& prompt = std::get<PromptTokens>(rendered);
  return ok_json_reply(dump_json(Json{{"input_tokens", prompt.ids.size()}}));
}

Reply ApiService::messages(std::string_view body, ClientConnection& client) {
  MessagesRequest req;
  if (auto err = parse_messages_request(body, limits_, MessagesCall::kCreate, &req))
    return error(*err, kMessagesEndpoint);
  const std::string id = new_id("msg_");
  auto rendered = render_prompt(req.prompt, kMessagesEndpoint, id);
  if (auto* reply = std::get_if<Reply>(&rendered)) return std::move(*reply);
  auto prompt = std::get<PromptTokens>(std::move(rendered));

  GenerationRequest g;
  g.id = id;
  g.prompt_ids = prompt.ids;
  g.sampling = req.common.sampling;
  auto admitted = admit(std::move(g), req.common.stop, req.common.max_tokens, kMessagesEndpoint);
  if (auto* reply = std::get_if<Reply>(&admitted)) return std::move(*reply);
  Admitted a = std::get<Admitted>(std::move(admitted));
  if (req.common.stream) return stream_messages(std::move(a), std::move(req), std::move(prompt));

  auto collected = collect(a, client);
  if (!collected) return client_gone_reply();
  const GenerationResult& r = collected->result;
  if (r.reason == FinishReason::kError || r.reason == FinishReason::kCancelled) return engine_failure(a, r);

  auto turn = frontend_.parser->start_turn(parse_options(req.prompt), prompt);
  turn->feed(collected->text);
  const ParsedOutput parsed = limit_calls(req.parallel_tool_calls, turn->finish());
  std::vector<std::string> ids;
  for (size_t i = 0; i < parsed.tool_calls.size(); ++i) ids.push_back(new_id("toolu_"));
  const bool context_bound =
      *req.common.max_tokens > engine_.context_size - static_cast<int64_t>(prompt.ids.size());
  const Json j = message_json(message_meta(a.meta), message_content_json(parsed, ids),
                              anthropic_stop_reason(r, !parsed.tool_calls.empty(), context_bound),
                              r.stop_string, r.stats);
  log_finished(a, 200, r, "");
  return ok_json_reply(dump_json(j));
}

Reply ApiService::stream_messages(Admitted admitted, MessagesRequest request, PromptTokens prompt_tokens) {
  struct State {
    Admitted a;
    MessagesRequest req;
    PromptTokens prompt;
  };
  auto st = std::make_shared<State>(State{std::move(admitted), std::move(request), std::move(prompt_tokens)});
  return event_stream_reply([this, st](ClientConnection& client) {
    Admitted& a = st->a;
    const MessagesRequest& req = st->req;
    const MessageMeta meta = message_meta(a.meta);
    const auto prompt_size = static_cast<int32_t>(st->prompt.ids.size());
    // Anthropic's keep-alive is a ping event, sent once after message_start and then while nothing else is.
    StreamWriter w(client, sse_event(ping_event()));
    w.raw(sse_event(message_start_event(meta, prompt_size)));
    w.keepalive();

    MessageEventBuilder blocks;
    auto turn = frontend_.parser->start_turn(parse_options(req.prompt), st->prompt);
    auto send = [&](const std::vector<OJson>& events) {
      for (const OJson& e : events) {
        if (!w.raw(sse_event(e))) return false;
      }
      return true;
    };
    auto result = pump(a, w, [&](GenerationOutput& out) {
      return send(blocks.update(limit_calls(req.parallel_tool_calls, turn->feed(out.text))));
    });
    if (!result) return;
    if (result->reason == FinishReason::kError || result->reason == FinishReason::kCancelled) {
      const Reply err = engine_failure(a, *result);
      w.raw("event: error\ndata: " + err.body + "\n\n");
      return;
    }
    const ParsedOutput final_parse = limit_calls(req.parallel_tool_calls, turn->finish());
    send(blocks.update(final_parse));
    send(blocks.finish());
    const bool context_bound = *req.common.max_tokens > engine_.context_size - prompt_size;
    w.raw(sse_event(
        message_delta_event(anthropic_stop_reason(*result, !final_parse.tool_calls.empty(), context_bound),
                            result->stop_string, result->stats)));
    w.raw(sse_event(message_stop_event()));
    log_finished(a, 200, *result, w.failed() ? "client disconnected at the end" : "");
  });
}

}  // namespace pd::server
