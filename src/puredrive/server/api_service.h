// The OpenAI-compatible API and Anthropic's Messages API, independent of the HTTP library: each endpoint
// takes the request body and the client connection and returns a Reply (status, headers, body, or a function
// that streams the body as server-sent events). http_server.cpp serves it over HTTP; tests can call it
// directly.
//
// A generation request goes: parse + validate (chat_request / completion_request / anthropic_request) ->
// PromptBuilder ->
// context check -> Scheduler::submit -> events -> OutputParser (chat) -> JSON or SSE chunks. The HTTP thread
// only waits on the request's event queue; the connection cancels the generation as soon as its client is
// gone (ClientConnection::on_gone), and the waiting thread checks the client between events as well.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "puredrive/server/anthropic_request.h"
#include "puredrive/server/api_error.h"
#include "puredrive/server/chat_request.h"
#include "puredrive/server/completion_request.h"
#include "puredrive/server/engine_port.h"
#include "puredrive/server/frontend.h"
#include "puredrive/server/metrics.h"
#include "puredrive/server/openai_format.h"
#include "puredrive/server/scheduler.h"

namespace pd::server {

class StreamWriter;

// What a request needs from its client connection while it runs.
class ClientConnection {
 public:
  virtual ~ClientConnection() = default;
  // Streams only: sends bytes; false once the client is gone.
  virtual bool write(std::string_view data) = 0;
  // False once the client closed or reset the connection.
  virtual bool alive() = 0;
  // Registers `cancel` to run, possibly on another thread, as soon as the client is seen gone (at once if it
  // already is), so that its generation stops within one step instead of at the next poll of alive().
  // Connections that cannot watch their socket keep this no-op and are polled.
  virtual void on_gone(std::function<void()> cancel) { (void)cancel; }
};

struct Reply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  // Set for streams (status 200, text/event-stream): writes the whole body through the connection.
  std::function<void(ClientConnection&)> stream;
};

Reply ok_json_reply(std::string body);
// A server-sent-events reply (no caching, no proxy buffering) whose body `write` streams.
Reply event_stream_reply(std::function<void(ClientConnection&)> write);
// Placeholder reply for a client that left before its response: nothing is delivered, 499 is logged.
Reply client_gone_reply();

struct ServiceOptions {
  std::vector<std::string> model_names;  // accepted "model" values; the first is the id that is listed
  std::chrono::milliseconds keepalive_interval{3000};  // SSE comment when nothing was written this long
  std::chrono::milliseconds poll_interval{100};        // how often a waiting request checks its client
  int retry_after_seconds = 2;                         // Retry-After of a 503 for a full queue
};

class ApiService {
 public:
  ApiService(ServiceOptions options, Scheduler& scheduler, EngineInfo engine, Frontend frontend,
             Metrics& metrics);

  Reply chat_completions(std::string_view body, ClientConnection& client);
  Reply completions(std::string_view body, ClientConnection& client);
  // Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens (messages_endpoint.cpp).
  Reply messages(std::string_view body, ClientConnection& client);
  Reply count_message_tokens(std::string_view body);
  Reply list_models() const;
  Reply get_model(std::string_view id) const;
  Reply health() const;
  Reply metrics() const;
  // The built-in web page (GET / and GET /bench) and what it shows of the server, GET /v1/puredrive/info
  // (web_endpoint.cpp).
  Reply web_page(std::string_view path) const;
  Reply server_info() const;
  // An error reply, logged with its cause and counted by type; in Anthropic's shape for the Anthropic
  // endpoints (anthropic_endpoint()), else in OpenAI's.
  Reply error(const ApiError& e, std::string_view endpoint, std::string_view request_id = "") const;

 private:
  // A request the scheduler accepted.
  struct Admitted {
    std::shared_ptr<RequestHandle> handle;
    ResponseMeta meta;
    std::string endpoint;
    std::chrono::steady_clock::time_point start;

    Admitted() = default;
    Admitted(Admitted&&) = default;
    Admitted& operator=(Admitted&&) = default;
    // A request that nobody waits for any more (e.g. a stream whose body was never sent) must not keep the
    // engine busy. Cancelling a finished request does nothing.
    ~Admitted() {
      if (handle) handle->cancel();
    }
  };
  struct Collected {
    std::string text;
    std::vector<TokenLogprob> logprobs;
    GenerationResult result;
  };

  // The refusal of a prompt whose text (text_bytes) cannot fit the context whatever its tokenization.
  std::optional<Reply> refuse_untokenizable(size_t text_bytes, std::string_view param,
                                            std::string_view endpoint, std::string_view id) const;
  // The chat template applied to a prompt, or the error reply (400 invalid_prompt when the template refused).
  std::variant<PromptTokens, Reply> render_prompt(const ChatPrompt& prompt, std::string_view endpoint,
                                                  std::string_view request_id) const;
  // Context check, submit, or the error reply.
  std::variant<Admitted, Reply> admit(GenerationRequest request, std::vector<std::string> stop,
                                      std::optional<int32_t> max_tokens, std::string_view endpoint);
  // Non-streaming: waits for the whole generation; nullopt when the client went away first.
  std::optional<Collected> collect(Admitted& a, ClientConnection& client);
  // Streaming: runs on_output for every engine output and ends when the request finishes; nullopt when
  // the client went away (the generation is then cancelled).
  std::optional<GenerationResult> pump(Admitted& a, StreamWriter& writer,
                                       const std::function<bool(GenerationOutput&)>& on_output);
  void log_finished(const Admitted& a, int status, const GenerationResult& r, std::string_view note) const;
  Reply engine_failure(const Admitted& a, const GenerationResult& r) const;

  Reply stream_chat(Admitted a, ChatRequest req, PromptTokens prompt);
  Reply stream_completion(Admitted a, CompletionRequest req, std::string echo_text);
  Reply stream_messages(Admitted a, MessagesRequest req, PromptTokens prompt);

  ServiceOptions options_;
  Scheduler& scheduler_;
  EngineInfo engine_;
  Frontend frontend_;
  Metrics& metrics_;
  RequestLimits limits_;
  std::string fingerprint_;
  int64_t started_at_ = 0;
};

}  // namespace pd::server
