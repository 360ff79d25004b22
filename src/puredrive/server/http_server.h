// The HTTP front door: cpp-httplib routes, API-key check, OpenAI-shaped errors for every failure the
// library itself detects (unknown route 404, wrong method 405, body over the limit 413, malformed
// request 400), read/write timeouts against slow or stalled clients, and the adapter from a Reply to an
// httplib response (SSE through a chunked content provider).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "puredrive/server/api_service.h"
#include "puredrive/util/status.h"

namespace httplib {
class Server;
}

namespace pd::server {

struct HttpOptions {
  std::string host = "127.0.0.1";  // loopback unless asked otherwise
  int port = 8000;                 // 0: any free port (see bind())
  std::string api_key;             // empty: no authentication
  size_t max_body_bytes = 32u << 20;
  int read_timeout_seconds = 10;   // per read: a stalled body or header line is dropped after this
  int write_timeout_seconds = 30;  // a client that stops reading its stream is dropped after this
  int threads = 64;                // concurrent connections (streams waiting in the queue hold one each)
};

class HttpServer {
 public:
  HttpServer(HttpOptions options, ApiService& service, Metrics& metrics);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the listening socket; returns the port (useful with port 0).
  Expected<int> bind();
  // Serves until stop(); call after bind().
  void run();
  void stop();

 private:
  void install_routes();

  HttpOptions options_;
  ApiService& service_;
  Metrics& metrics_;
  std::unique_ptr<httplib::Server> server_;
};

}  // namespace pd::server
