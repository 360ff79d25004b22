#include "puredrive/server/http_router.h"

#include <fmt/format.h>

namespace pd::server {
namespace {

// Compares without an early exit, so response time does not reveal how much of a guessed key was right.
bool same_secret(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// "/" itself (the web page) is exact: as a prefix it would take every path.
bool matches(const std::string& pattern, std::string_view path) {
  if (pattern.size() > 1 && pattern.back() == '/') {
    return path.size() > pattern.size() && path.substr(0, pattern.size()) == pattern;
  }
  return path == pattern;
}

}  // namespace

HttpRouter::HttpRouter(std::string api_key, size_t max_body_bytes, ApiService& service)
    : api_key_(std::move(api_key)), max_body_bytes_(max_body_bytes), service_(service) {
  ApiService& s = service_;
  routes_ = {
      {"POST", "/v1/chat/completions", false,
       [&s](const HttpRequest& r, ClientConnection& c) { return s.chat_completions(r.body, c); }},
      {"POST", "/v1/completions", false,
       [&s](const HttpRequest& r, ClientConnection& c) { return s.completions(r.body, c); }},
      {"POST", "/v1/messages", false,
       [&s](const HttpRequest& r, ClientConnection& c) { return s.messages(r.body, c); }},
      {"POST", "/v1/messages/count_tokens", false,  // renders and tokenizes
       [&s](const HttpRequest& r, ClientConnection&) { return s.count_message_tokens(r.body); }},
      {"GET", "/v1/models", true, [&s](const HttpRequest&, ClientConnection&) { return s.list_models(); }},
      {"GET", "/v1/models/", true,
       [&s](const HttpRequest& r, ClientConnection&) {
         return s.get_model(std::string_view(r.path).substr(std::string_view("/v1/models/").size()));
       }},
      {"GET", "/health", true, [&s](const HttpRequest&, ClientConnection&) { return s.health(); }},
      {"GET", "/metrics", true, [&s](const HttpRequest&, ClientConnection&) { return s.metrics(); }},
      {"GET", "/v1/puredrive/info", true,
       [&s](const HttpRequest&, ClientConnection&) { return s.server_info(); }},
      {"GET", "/", true, [&s](const HttpRequest& r, ClientConnection&) { return s.web_page(r.path); }},
      {"GET", "/bench", true, [&s](const HttpRequest& r, ClientConnection&) { return s.web_page(r.path); }},
  };
}

std::string HttpRouter::endpoint_label(std::string_view path) {
  for (const char* r :
       {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens", "/v1/models",
        "/health", "/metrics", "/v1/puredrive/info", "/", "/bench"}) {
    if (path == r) return std::string(path);
  }
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  return "other";
}

bool HttpRouter::authorized(const HttpRequest& req) const {
  if (api_key_.empty() || req.path.rfind("/v1/", 0) != 0) return true;
  constexpr std::string_view prefix = "Bearer ";
  const std::string_view auth = req.authorization;
  if (auth.substr(0, prefix.size()) == prefix && same_secret(auth.substr(prefix.size()), api_key_))
    return true;
  return !req.x_api_key.empty() && same_secret(req.x_api_key, api_key_);
}

HttpRouter::Route HttpRouter::route(const HttpRequest& head) const {
  const std::string label = endpoint_label(head.path);
  Route out;
  if (!authorized(head)) {
    out.early = service_.error(
        api_error(401, "invalid_request_error",
                  head.authorization.empty() && head.x_api_key.empty()
                      ? "You didn't provide an API key. Send it as 'Authorization: Bearer KEY' or "
                        "'x-api-key: KEY'."
                      : "Incorrect API key provided.",
                  "invalid_api_key"),
        label);
    out.early.headers.emplace_back("WWW-Authenticate", "Bearer");
    return out;
  }
  std::string allow;
  for (const Entry& e : routes_) {
    if (!matches(e.path, head.path)) continue;
    if (e.method == head.method) {
      out.handler = e.handler;
      out.inline_ok = e.inline_ok;
      return out;
    }
    if (allow.find(e.method) == std::string::npos) allow += allow.empty() ? e.method : ", " + e.method;
  }
  if (!allow.empty()) {
    // A known route with the wrong method: 405 with Allow, rather than the 404 of an unknown route.
    out.early = service_.error(api_error(405, "invalid_request_error",
                                         fmt::format("Method {} is not allowed for {}; use {}.",
                                                     echo(head.method), echo(head.path), allow),
                                         "method_not_allowed"),
                               label);
    out.early.headers.emplace_back("Allow", allow);
    return out;
  }
  out.early =
      service_.error(api_error(404, "invalid_request_error",
                               fmt::format("Unknown request URL: {} {}.", echo(head.method), echo(head.path)),
                               "unknown_url"),
                     label);
  return out;
}

ApiError HttpRouter::failure_error(HttpFailure f) const {
  switch (f) {
    case HttpFailure::kBadRequest:
      return api_error(400, "invalid_request_error",
                       "Malformed HTTP request: bad request line, header or chunked body, or a header line "
                       "over 8192 bytes.",
                       "bad_http_request");
    case HttpFailure::kUriTooLong:
      return api_error(414, "invalid_request_error", "The request URL is too long.", "uri_too_long");
    case HttpFailure::kBodyTooLarge:
      return api_error(413, "invalid_request_error",
                       fmt::format("The request body is larger than {} bytes.", max_body_bytes_),
                       "payload_too_large");
    case HttpFailure::kServerBusy:
      return api_error(503, "server_error",
                       "The server is busy: every request handler is taken. Retry after a few seconds.",
                       "server_busy");
    case HttpFailure::kTooManyConnections:
      return api_error(503, "server_error",
                       "Too many open connections (from this address, or in all). Close idle connections or "
                       "retry after a few seconds.",
                       "too_many_connections");
  }
  return api_error(500, "server_error", "Unknown HTTP failure.");
}

Reply HttpRouter::failure(HttpFailure f, std::string_view path) const {
  Reply r = service_.error(failure_error(f), endpoint_label(path));
  if (r.status == 503) r.headers.emplace_back("Retry-After", "2");
  return r;
}

Reply HttpRouter::internal_error(std::string_view what, std::string_view path) const {
  return service_.error(api_error(500, "server_error", "Internal error: " + echo(what)),
                        endpoint_label(path));
}

}  // namespace pd::server
