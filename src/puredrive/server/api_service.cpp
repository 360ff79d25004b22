#include "puredrive/server/api_service.h"

#include <fmt/format.h>

#include "puredrive/server/anthropic_format.h"
#include "puredrive/server/stream_writer.h"
#include "puredrive/util/clock.h"
#include "puredrive/util/log.h"

namespace pd::server {
namespace {

using Clock = std::chrono::steady_clock;

// How long a cancelled request's HTTP thread waits for the engine to confirm, to log its statistics.
constexpr auto kCancelConfirmWait = std::chrono::seconds(2);
constexpr size_t kMaxErrorMessageBytes = 2048;

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Reply json_reply(int status, const Json& j) {
  Reply r;
  r.status = status;
  r.body = dump_json(j);
  return r;
}

// Waits for the kFinished event of a cancelled request (its stats are logged); gives up after a while.
GenerationResult await_finish(RequestHandle& handle) {
  const auto deadline = Clock::now() + kCancelConfirmWait;
  while (Clock::now() < deadline) {
    auto ev = handle.next(std::chrono::milliseconds(50));
    if (ev && ev->kind == StreamEvent::Kind::kFinished) return ev->result;
  }
  GenerationResult r;
  r.reason = FinishReason::kCancelled;
  return r;
}

}  // namespace

Reply ok_json_reply(std::string body) {
  Reply r;
  r.body = std::move(body);
  return r;
}

Reply event_stream_reply(std::function<void(ClientConnection&)> write) {
  Reply r;
  r.content_type = "text/event-stream";
  r.headers = {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}};
  r.stream = std::move(write);
  return r;
}

Reply client_gone_reply() {
  Reply r;
  r.status = 499;
  return r;
}

ApiService::ApiService(ServiceOptions options, Scheduler& scheduler, EngineInfo engine, Frontend frontend,
                       Metrics& metrics)
    : options_(std::move(options)),
      scheduler_(scheduler),
      engine_(std::move(engine)),
      frontend_(std::move(frontend)),
      metrics_(metrics),
      started_at_(unix_now()) {
  if (options_.model_names.empty()) options_.model_names.push_back(engine_.model_id);
  limits_.model_names = options_.model_names;
  limits_.vocab_size = frontend_.prompts->vocab_size();
  // Changes whenever something that can change outputs for a fixed seed changes (the backend's kernels);
  // the MTP draft length does not, by the exactness contract.
  fingerprint_ = fmt::format("fp_puredrive_0.1.0_{}", engine_.backend);
}

Reply ApiService::error(const ApiError& error, std::string_view endpoint, std::string_view request_id) const {
  ApiError e = error;
  // Messages quote client text through echo(); this bounds whatever slipped through.
  e.message = echo(e.message, kMaxErrorMessageBytes);
  metrics_.on_error(e.code.empty() ? e.type : e.code);
  Reply r;
  if (anthropic_endpoint(endpoint)) {
    r.status = anthropic_status(e);
    r.body = dump_json(anthropic_error_json(e));
  } else {
    r.status = e.status;
    r.body = e.to_json();
  }
  const std::string id = request_id.empty() ? "-" : std::string(request_id);
  if (r.status >= 500) {
    PD_LOG_ERROR("{} {} {} {}: {}", id, endpoint, r.status, e.type, log_safe(e.message));
  } else {
    PD_LOG_WARN("{} {} {} {}: {}", id, endpoint, r.status, e.code.empty() ? e.type : e.code,
                log_safe(e.message));
  }
  return r;
}

std::optional<Reply> ApiService::refuse_untokenizable(size_t text_bytes, std::string_view param,
                                                      std::string_view endpoint, std::string_view id) const {
  // Tokenizing costs tens of times the text's size in memory, so a text that cannot fit is refused by its
  // length alone. Each token covers at most max_token_bytes bytes of normalized text, and normalization
  // (NFC, as in the Qwen tokenizers) makes text at most 3x shorter (Hangul jamo); 4 leaves a margin.
  const size_t longest = frontend_.prompts->max_token_bytes();
  if (longest == 0) return std::nullopt;
  const auto ctx = static_cast<size_t>(engine_.context_size);
  if (text_bytes / (4 * longest) < ctx) return std::nullopt;
  return error(
      invalid_request(fmt::format("This model's maximum context length is {} tokens, but the prompt is {} "
                                  "bytes long, which is more than {} tokens whatever its tokenization. "
                                  "Shorten the prompt.",
                                  ctx, text_bytes, ctx),
                      std::string(param), "context_length_exceeded"),
      endpoint, id);
}

std::variant<PromptTokens, Reply> ApiService::render_prompt(const ChatPrompt& prompt,
                                                            std::string_view endpoint,
                                                            std::string_view request_id) const {
  // Only what every chat template renders whole counts: earlier assistant turns may be shortened.
  size_t text_bytes = 0;
  for (const ChatMessage& m : prompt.messages) {
    if (m.role != "assistant") text_bytes += m.content.size();
  }
  if (auto refusal = refuse_untokenizable(text_bytes, "messages", endpoint, request_id)) {
    return std::move(*refusal);
  }
  auto tokens = frontend_.prompts->render_chat(prompt);
  if (tokens) return std::move(*tokens);
  ApiError e = error_from_status(tokens.status());
  if (e.status == 400) {
    e.param = "messages";
    e.code = "invalid_prompt";
  }
  return error(e, endpoint, request_id);
}

std::variant<ApiService::Admitted, Reply> ApiService::admit(GenerationRequest request,
                                                            std::vector<std::string> stop,
                                                            std::optional<int32_t> max_tokens,
                                                            std::string_view endpoint) {
  const auto prompt = static_cast<int64_t>(request.prompt_ids.size());
  const int32_t ctx = engine_.context_size;
  if (prompt == 0) {
    return error(invalid_request("The prompt is empty after tokenization.", "prompt", "invalid_value"),
                 endpoint, request.id);
  }
  if (prompt >= ctx) {
    return error(
        invalid_request(fmt::format("This model's maximum context length is {} tokens, but the prompt has {} "
                                    "tokens, which leaves no room to generate. Shorten the prompt or start "
                                    "the server with a larger --ctx-size.",
                                    ctx, prompt),
                        endpoint == "/v1/completions" ? "prompt" : "messages", "context_length_exceeded"),
        endpoint, request.id);
  }
  // An explicit max_tokens beyond the context is capped (finish_reason "length" when it fills up), which
  // suits agents that always ask for a large budget.
  const auto room = static_cast<int32_t>(ctx - prompt);
  request.max_tokens = max_tokens ? std::min(*max_tokens, room) : room;
  request.stop_token_ids = frontend_.prompts->stop_token_ids();
  const std::string id = request.id;
  auto handle = scheduler_.submit(std::move(request), std::move(stop));
  if (!handle) {
    const QueueGauges q = scheduler_.gauges();
    ApiError e =
        api_error(503, "server_error",
                  fmt::format("The server is busy: {} requests are already waiting for the engine (the "
                              "limit set by --max-queue). Retry after a few seconds.",
                              q.waiting),
                  "queue_full");
    Reply r = error(e, endpoint, id);
    r.headers.emplace_back("Retry-After", std::to_string(options_.retry_after_seconds));
    return r;
  }
  Admitted a;
  a.handle = std::move(handle);
  a.meta = ResponseMeta{
      .id = id, .created = unix_now(), .model = options_.model_names[0], .system_fingerprint = fingerprint_};
  a.endpoint = std::string(endpoint);
  a.start = Clock::now();
  return a;
}

std::optional<ApiService::Collected> ApiService::collect(Admitted& a, ClientConnection& client) {
  client.on_gone([handle = a.handle] { handle->cancel(); });
  Collected c;
  for (;;) {
    // Checked between events too: a generation that produces tokens without pause never times out here.
    if (!client.alive()) {
      a.handle->cancel();
      log_finished(a, 499, await_finish(*a.handle), "client disconnected");
      return std::nullopt;
    }
    auto ev = a.handle->next(options_.poll_interval);
    if (!ev) continue;
    if (ev->kind == StreamEvent::Kind::kFinished) {
      if (ev->result.reason == FinishReason::kCancelled && !client.alive()) {
        log_finished(a, 499, ev->result, "client disconnected");
        return std::nullopt;
      }
      c.result = std::move(ev->result);
      return c;
    }
    c.text += ev->output.text;
    for (auto& lp : ev->output.logprobs) c.logprobs.push_back(std::move(lp));
  }
}

std::optional<GenerationResult> ApiService::pump(Admitted& a, StreamWriter& writer,
                                                 const std::function<bool(GenerationOutput&)>& on_output) {
  writer.client().on_gone([handle = a.handle] { handle->cancel(); });
  bool gone = writer.failed();
  while (!gone) {
    auto ev = a.handle->next(options_.poll_interval);
    if (!ev) {
      // Keep-alives keep proxies and clients from timing out during long prefills and queue waits; a
      // failed write or a closed socket means the client left.
      if (writer.since_last_write() >= options_.keepalive_interval) {
        gone = !writer.keepalive();
      } else {
        gone = !writer.client().alive();
      }
      continue;
    }
    if (ev->kind == StreamEvent::Kind::kFinished) {
      if (ev->result.reason == FinishReason::kCancelled && !writer.client().alive()) {
        log_finished(a, 200, ev->result, "client disconnected mid-stream");
        return std::nullopt;
      }
      return std::move(ev->result);
    }
    gone = !on_output(ev->output) || writer.failed();
  }
  a.handle->cancel();
  log_finished(a, 200, await_finish(*a.handle), "client disconnected mid-stream");
  return std::nullopt;
}

Reply ApiService::engine_failure(const Admitted& a, const GenerationResult& r) const {
  log_finished(a, r.reason == FinishReason::kError ? 500 : 503, r, r.error);
  if (r.reason == FinishReason::kError) {
    return error(api_error(500, "server_error", "Generation failed: " + r.error), a.endpoint, a.meta.id);
  }
  return error(api_error(503, "server_error", "The server is shutting down.", "shutting_down"), a.endpoint,
               a.meta.id);
}

void ApiService::log_finished(const Admitted& a, int status, const GenerationResult& r,
                              std::string_view note) const {
  const GenerationStats& s = r.stats;
  PD_LOG_INFO(
      "{} {} {} finish={} prompt={} (cached {}) completion={} queue={:.3f}s prefill={:.3f}s decode={:.3f}s "
      "{:.1f} tok/s mtp={:.2f} tok/step total={:.3f}s{}{}",
      a.meta.id, a.endpoint, status, finish_reason_name(r.reason), s.prompt_tokens, s.cached_prompt_tokens,
      s.completion_tokens, a.handle->queue_seconds(), s.prefill_seconds, s.decode_seconds,
      s.decode_tokens_per_second(), s.tokens_per_step(), seconds_since(a.start), note.empty() ? "" : " ",
      note);
}

Reply ApiService::list_models() const {
  Json data = Json::array();
  data.push_back({{"id", options_.model_names[0]},
                  {"object", "model"},
                  {"created", started_at_},
                  {"owned_by", "puredrive"},
                  {"max_model_len", engine_.context_size}});
  return json_reply(200, Json{{"object", "list"}, {"data", data}});
}

Reply ApiService::get_model(std::string_view id) const {
  for (const auto& name : options_.model_names) {
    if (name == id) {
      return json_reply(200, Json{{"id", name},
                                  {"object", "model"},
                                  {"created", started_at_},
                                  {"owned_by", "puredrive"},
                                  {"max_model_len", engine_.context_size}});
    }
  }
  return error(ApiError{.status = 404,
                        .type = "invalid_request_error",
                        .message = fmt::format("The model '{}' does not exist.", echo(id)),
                        .param = "model",
                        .code = "model_not_found"},
               "/v1/models");
}

Reply ApiService::health() const {
  const QueueGauges q = scheduler_.gauges();
  return json_reply(200, Json{{"status", "ok"},
                              {"model", options_.model_names[0]},
                              {"backend", engine_.backend},
                              {"queue_length", q.waiting},
                              {"running", q.running}});
}

Reply ApiService::metrics() const {
  Reply r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  r.body = metrics_.render(scheduler_.gauges());
  return r;
}

}  // namespace pd::server
