// What the HTTP layer does with a complete request, independent of how it was read: the route table, the
// API-key check, 404/405, and OpenAI-shaped errors for what the connection layer detects itself (bad HTTP,
// bodies over the limit, saturation). http_server.cpp reads requests and writes replies; this file decides
// them. Cheap routes (health, metrics, models, every error) are answered on the I/O thread; generation
// routes run on a handler thread because they tokenize and wait for the engine.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "puredrive/server/api_service.h"

namespace pd::server {

struct HttpRequest {
  std::string method;  // as sent, e.g. "POST"
  std::string path;    // the target without its query string
  std::string authorization;
  std::string x_api_key;  // Anthropic's clients send the key here
  std::string body;
};

// Failures the connection layer finds before a request reaches a route.
enum class HttpFailure {
  kBadRequest,    // malformed request line, header or chunked body
  kUriTooLong,    // request target over kMaxTargetBytes
  kBodyTooLarge,  // declared or received body over the limit
  kServerBusy,    // no handler thread free
  kTooManyConnections,
};

class HttpRouter {
 public:
  HttpRouter(std::string api_key, size_t max_body_bytes, ApiService& service);

  // Resolves the route of a request whose headers are in; 401, 404 and 405 are decided here, before any
  // body is read.
  struct Route {
    std::function<Reply(const HttpRequest&, ClientConnection&)> handler;  // empty: `early` is the answer
    bool inline_ok = true;                                                // cheap enough for the I/O thread
    Reply early;
  };
  Route route(const HttpRequest& head) const;

  // The error of a failure, and the same as a reply (logged and counted like every error reply).
  ApiError failure_error(HttpFailure f) const;
  Reply failure(HttpFailure f, std::string_view path) const;
  // 500 for a handler that threw.
  Reply internal_error(std::string_view what, std::string_view path) const;

  // Metrics label: known routes by name, everything else "other", so that random URLs cannot create series.
  static std::string endpoint_label(std::string_view path);

 private:
  struct Entry {
    std::string method;
    std::string path;  // exact, or a prefix when it ends with '/' (except "/" itself)
    bool inline_ok;
    std::function<Reply(const HttpRequest&, ClientConnection&)> handler;
  };
  bool authorized(const HttpRequest& req) const;

  std::string api_key_;
  size_t max_body_bytes_;
  ApiService& service_;
  std::vector<Entry> routes_;
};

}  // namespace pd::server
