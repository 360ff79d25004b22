#include "puredrive/server/http_server.h"

#include <httplib.h>

#include <fmt/format.h>

#include "puredrive/server/connection_probe.h"

namespace pd::server {
namespace {

constexpr const char* kPostRoutes[] = {"/v1/chat/completions", "/v1/completions", "/v1/messages",
                                       "/v1/messages/count_tokens"};
constexpr const char* kGetRoutes[] = {"/v1/models", "/health", "/metrics"};

// The connection of one request: a lazily found socket probe, and for streams the chunked sink.
class HttpConnection final : public ClientConnection {
 public:
  HttpConnection(const httplib::Request& req, httplib::DataSink* sink) : req_(req), sink_(sink) {}

  bool write(std::string_view data) override { return sink_ && sink_->write(data.data(), data.size()); }
  bool alive() override {
    if (!searched_) {
      probe_ = ConnectionProbe::find(req_.local_addr, req_.local_port, req_.remote_addr, req_.remote_port);
      searched_ = true;
    }
    return !probe_.peer_closed();
  }

 private:
  const httplib::Request& req_;
  httplib::DataSink* sink_;
  ConnectionProbe probe_;
  bool searched_ = false;
};

// Metrics label: known routes by name, everything else as "other" so that random URLs cannot blow up the
// number of series.
std::string endpoint_label(const std::string& path) {
  for (const char* r : kPostRoutes) {
    if (path == r) return path;
  }
  for (const char* r : kGetRoutes) {
    if (path == r) return path;
  }
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  return "other";
}

// Compares without an early exit, so response time does not reveal how much of a guessed key was right.
bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

void apply(Reply reply, const httplib::Request& req, httplib::Response& res) {
  res.status = reply.status;
  for (const auto& [k, v] : reply.headers) res.set_header(k, v);
  if (!reply.stream) {
    res.set_content(reply.body, reply.content_type);
    return;
  }
  auto stream = std::move(reply.stream);
  res.set_chunked_content_provider(reply.content_type, [stream, &req](size_t, httplib::DataSink& sink) {
    HttpConnection conn(req, &sink);
    stream(conn);
    sink.done();
    return true;
  });
}

}  // namespace

HttpServer::HttpServer(HttpOptions options, ApiService& service, Metrics& metrics)
    : options_(std::move(options)),
      service_(service),
      metrics_(metrics),
      server_(std::make_unique<httplib::Server>()) {
  const int threads = options_.threads;
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  server_->set_payload_max_length(options_.max_body_bytes);
  server_->set_read_timeout(options_.read_timeout_seconds, 0);
  server_->set_write_timeout(options_.write_timeout_seconds, 0);
  install_routes();
}

HttpServer::~HttpServer() = default;

void HttpServer::install_routes() {
  httplib::Server& s = *server_;
  auto send = [](httplib::Response& res, const Reply& r) {
    res.status = r.status;
    for (const auto& [k, v] : r.headers) res.set_header(k, v);
    res.set_content(r.body, r.content_type);
  };

  s.set_pre_routing_handler([this, send](const httplib::Request& req, httplib::Response& res) {
    if (options_.api_key.empty() || req.path.rfind("/v1/", 0) != 0)
      return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    if (auth.rfind(prefix, 0) == 0 && same_secret(auth.substr(prefix.size()), options_.api_key)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    // Anthropic's clients send the key as x-api-key.
    const std::string x_api_key = req.get_header_value("x-api-key");
    if (!x_api_key.empty() && same_secret(x_api_key, options_.api_key)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    ApiError e = api_error(401, "invalid_request_error",
                           auth.empty() && x_api_key.empty()
                               ? "You didn't provide an API key. Send it as 'Authorization: Bearer KEY' or "
                                 "'x-api-key: KEY'."
                               : "Incorrect API key provided.",
                           "invalid_api_key");
    Reply r = service_.error(e, endpoint_label(req.path));
    r.headers.emplace_back("WWW-Authenticate", "Bearer");
    send(res, r);
    return httplib::Server::HandlerResponse::Handled;
  });

  s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HttpConnection conn(req, nullptr);
    apply(service_.chat_completions(req.body, conn), req, res);
  });
  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HttpConnection conn(req, nullptr);
    apply(service_.completions(req.body, conn), req, res);
  });
  s.Post("/v1/messages", [this](const httplib::Request& req, httplib::Response& res) {
    HttpConnection conn(req, nullptr);
    apply(service_.messages(req.body, conn), req, res);
  });
  s.Post("/v1/messages/count_tokens", [this, send](const httplib::Request& req, httplib::Response& res) {
    send(res, service_.count_message_tokens(req.body));
  });
  s.Get("/v1/models",
        [this, send](const httplib::Request&, httplib::Response& res) { send(res, service_.list_models()); });
  s.Get("/v1/models/(.+)", [this, send](const httplib::Request& req, httplib::Response& res) {
    send(res, service_.get_model(req.matches[1].str()));
  });
  s.Get("/health",
        [this, send](const httplib::Request&, httplib::Response& res) { send(res, service_.health()); });
  s.Get("/metrics",
        [this, send](const httplib::Request&, httplib::Response& res) { send(res, service_.metrics()); });

  // Known routes with the wrong method: 405 with Allow, rather than the 404 of an unknown route.
  auto not_allowed = [this, send](const char* allow) {
    return [this, send, allow](const httplib::Request& req, httplib::Response& res) {
      Reply r = service_.error(
          api_error(405, "invalid_request_error",
                    fmt::format("Method {} is not allowed for {}; use {}.", req.method, req.path, allow),
                    "method_not_allowed"),
          endpoint_label(req.path));
      r.headers.emplace_back("Allow", allow);
      send(res, r);
    };
  };
  for (const char* route : kPostRoutes) {
    s.Get(route, not_allowed("POST"));
    s.Put(route, not_allowed("POST"));
    s.Patch(route, not_allowed("POST"));
    s.Delete(route, not_allowed("POST"));
  }
  for (const char* route : kGetRoutes) {
    s.Post(route, not_allowed("GET"));
    s.Put(route, not_allowed("GET"));
    s.Patch(route, not_allowed("GET"));
    s.Delete(route, not_allowed("GET"));
  }

  // Errors httplib produces itself arrive here with an empty body: give them OpenAI's shape.
  s.set_error_handler([this, send](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError e = api_error(res.status, "invalid_request_error", "");
    switch (res.status) {
      case 404:
        e.message = fmt::format("Unknown request URL: {} {}.", req.method, req.path);
        e.code = "unknown_url";
        break;
      case 413:
        e.message = fmt::format("The request body is larger than {} bytes.", options_.max_body_bytes);
        e.code = "payload_too_large";
        break;
      case 414:
        e.message = "The request URL is too long.";
        e.code = "uri_too_long";
        break;
      case 400:
        e.message =
            "Malformed HTTP request: bad request line or header, a header line over 8192 bytes, or a body "
            "that did "
            "not arrive in time.";
        e.code = "bad_http_request";
        break;
      default:
        e.message = fmt::format("The HTTP request could not be processed (status {}).", res.status);
        if (res.status >= 500) e.type = "server_error";
        break;
    }
    send(res, service_.error(e, endpoint_label(req.path)));
  });
  s.set_exception_handler([this, send](const httplib::Request& req, httplib::Response& res,
                                       std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
    }
    send(res,
         service_.error(api_error(500, "server_error", "Internal error: " + what), endpoint_label(req.path)));
  });
  // Counted when the status line is about to be written (httplib's logger runs only after the body is
  // out), so a client that holds a response always finds it in /metrics.
  s.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    metrics_.on_http_response(endpoint_label(req.path), res.status);
  });
}

Expected<int> HttpServer::bind() {
  int port = options_.port;
  if (port == 0) {
    port = server_->bind_to_any_port(options_.host);
    if (port < 0) return make_error(ErrorCode::kIo, "cannot bind {} on any port", options_.host);
  } else if (!server_->bind_to_port(options_.host, port)) {
    return make_error(ErrorCode::kIo, "cannot bind {}:{} (in use, or not an address of this machine)",
                      options_.host, port);
  }
  return port;
}

void HttpServer::run() {
  server_->listen_after_bind();
}

void HttpServer::stop() {
  server_->stop();
}

}  // namespace pd::server
