// The HTTP front door (HTTP/1.1 over Boost.Beast/Asio; docs/API.md "Connections" says why not
// cpp-httplib). Event-driven I/O on a few threads: a connection that is slow to send its headers or body,
// or idle between requests, holds no thread, only a socket and a small buffer, and it is dropped at a total
// deadline (not a per-read timeout that every byte restarts). Complete requests go to http_router.h: cheap
// routes are answered on the I/O thread, generation routes on a bounded pool of handler threads; when no
// handler is free the answer is an immediate 503. Connections are capped per client address and in all,
// again with an immediate 503. A handler waiting for the engine learns at once when its client hangs up
// (ClientConnection::on_gone), so the generation is cancelled within one engine step.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "puredrive/server/api_service.h"
#include "puredrive/util/status.h"

namespace pd::server {

struct HttpOptions {
  std::string host = "127.0.0.1";  // loopback unless asked otherwise
  int port = 8000;                 // 0: any free port (see bind())
  std::string api_key;             // empty: no authentication
  size_t max_body_bytes = 32u << 20;
  // Total deadlines: a request's headers must be complete this many seconds after the connection opened
  // (or after its first byte on a kept-alive connection), and its body this many seconds plus one per MiB
  // after the headers.
  int read_timeout_seconds = 10;
  int write_timeout_seconds = 30;  // one write of a response or stream chunk to a client that stopped reading
  int idle_timeout_seconds = 30;   // a kept-alive connection waiting for its next request
  int threads = 64;                // handler threads for generation requests (see docs/API.md)
  int io_threads = 2;              // threads that run all socket I/O
  int max_connections = 1024;      // open connections in all
  int max_connections_per_client = 128;  // open connections from one client address
  int max_requests_per_connection = 1000;
};

class HttpServer {
 public:
  HttpServer(HttpOptions options, ApiService& service, Metrics& metrics);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the listening socket; returns the port (useful with port 0).
  Expected<int> bind();
  // Serves until stop(); call after bind(). Returns once every connection is closed and every handler
  // thread has finished.
  void run();
  // Thread-safe; returns at once (run() does the closing).
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace pd::server
