// POST /v1/completions, streaming and not. The text is returned as generated: no template, no parsing.
#include <memory>

#include "puredrive/server/api_service.h"
#include "puredrive/server/stream_writer.h"

namespace pd::server {
namespace {

constexpr std::string_view kCompletionsEndpoint = "/v1/completions";

}  // namespace

Reply ApiService::completions(std::string_view body, ClientConnection& client) {
  CompletionRequest req;
  if (auto err = parse_completion_request(body, limits_, &req)) return error(*err, kCompletionsEndpoint);
  const std::string id = new_id("cmpl-");

  GenerationRequest g;
  g.id = id;
  std::string echo_text;
  if (req.prompt_is_ids) {
    g.prompt_ids = req.prompt_ids;
    if (req.echo) echo_text = frontend_.prompts->detokenize(req.prompt_ids);
  } else {
    if (auto refusal = refuse_untokenizable(req.prompt_text.size(), "prompt", kCompletionsEndpoint, id)) {
      return std::move(*refusal);
    }
    auto tokens = frontend_.prompts->tokenize(req.prompt_text);
    if (!tokens) {
      ApiError e = error_from_status(tokens.status());
      e.param = "prompt";
      return error(e, kCompletionsEndpoint, id);
    }
    g.prompt_ids = std::move(tokens->ids);
    if (req.echo) echo_text = req.prompt_text;
  }
  g.sampling = req.common.sampling;
  g.logprobs = req.logprobs;
  g.mtp = req.common.mtp;
  auto admitted = admit(std::move(g), req.common.stop, req.common.max_tokens, kCompletionsEndpoint);
  if (auto* reply = std::get_if<Reply>(&admitted)) return std::move(*reply);
  Admitted a = std::get<Admitted>(std::move(admitted));
  if (req.common.stream) return stream_completion(std::move(a), std::move(req), std::move(echo_text));

  auto collected = collect(a, client);
  if (!collected) return client_gone_reply();
  const GenerationResult& r = collected->result;
  if (r.reason == FinishReason::kError || r.reason == FinishReason::kCancelled) return engine_failure(a, r);
  std::optional<Json> lp;
  if (req.logprobs >= 0) lp = completion_logprobs(collected->logprobs, echo_text.size());
  const Json j = completion_json(a.meta, echo_text + collected->text, openai_finish_reason(r.reason, false),
                                 lp, r.stats);
  log_finished(a, 200, r, "");
  return ok_json_reply(dump_json(j));
}

Reply ApiService::stream_completion(Admitted admitted, CompletionRequest request, std::string echo_text) {
  struct State {
    Admitted a;
    CompletionRequest req;
    std::string echo;
  };
  auto st = std::make_shared<State>(State{std::move(admitted), std::move(request), std::move(echo_text)});
  return event_stream_reply([this, st](ClientConnection& client) {
    Admitted& a = st->a;
    const CompletionRequest& req = st->req;
    const bool usage = req.common.include_usage;
    StreamWriter w(client);
    size_t offset = st->echo.size();
    if (!st->echo.empty()) w.data(completion_chunk_json(a.meta, st->echo, nullptr, std::nullopt, usage));
    auto result = pump(a, w, [&](GenerationOutput& out) {
      if (out.text.empty() && out.logprobs.empty()) return true;
      std::optional<Json> lp;
      if (req.logprobs >= 0) {
        lp = completion_logprobs(out.logprobs, offset);
        for (const auto& l : out.logprobs) offset += l.token.size();
      }
      return w.data(completion_chunk_json(a.meta, out.text, nullptr, lp, usage));
    });
    if (!result) return;
    if (result->reason == FinishReason::kError || result->reason == FinishReason::kCancelled) {
      const Reply err = engine_failure(a, *result);
      w.raw("data: " + err.body + "\n\n");
      w.raw(sse_done());
      return;
    }
    w.data(
        completion_chunk_json(a.meta, "", openai_finish_reason(result->reason, false), std::nullopt, usage));
    if (usage) w.data(usage_chunk_json(a.meta, "text_completion", result->stats));
    w.raw(sse_done());
    log_finished(a, 200, *result, w.failed() ? "client disconnected at the end" : "");
  });
}

}  // namespace pd::server
