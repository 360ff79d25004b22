// TEST ONLY: a whole HTTP server in-process (GatedEngine, fake frontend, scheduler, ApiService, HttpServer on
// a free loopback port) for the server's connection tests.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "puredrive/server/http_server.h"
#include "puredrive/server/testing/fake_frontend.h"
#include "puredrive/server/testing/http_client.h"
#include "puredrive/server/testing/test_engines.h"

namespace pd::server::testing {

struct ServerSetup {
  size_t max_queue = 8;
  std::string api_key;
  size_t max_body = 1 << 20;
  std::chrono::milliseconds keepalive{3000};
  std::vector<std::string> script = {"Hello", " world"};
  int read_timeout_seconds = 1;
  int idle_timeout_seconds = 30;
  int threads = 16;
  int max_connections = 1024;
  int max_connections_per_client = 128;
};

class TestServer {
 public:
  explicit TestServer(const ServerSetup& s)
      : engine(s.script),
        scheduler(engine, s.max_queue, &metrics),
        service(options(s), scheduler, engine.info(), fake::make_fake_frontend(), metrics) {
    HttpOptions h;
    h.port = 0;
    h.api_key = s.api_key;
    h.max_body_bytes = s.max_body;
    h.read_timeout_seconds = s.read_timeout_seconds;
    h.idle_timeout_seconds = s.idle_timeout_seconds;
    h.threads = s.threads;
    h.max_connections = s.max_connections;
    h.max_connections_per_client = s.max_connections_per_client;
    http = std::make_unique<HttpServer>(h, service, metrics);
    auto p = http->bind();
    EXPECT_TRUE(p.has_value());
    port = p.has_value() ? *p : 0;
    thread = std::thread([this] { http->run(); });
  }
  ~TestServer() {
    engine.open_gate();
    http->stop();
    thread.join();
    scheduler.shutdown();
  }
  HttpReply get(const std::string& path, const std::string& headers = "") const {
    return http_request(port, "GET", path, "", headers);
  }
  HttpReply post(const std::string& path, const std::string& body, const std::string& headers = "") const {
    return http_request(port, "POST", path, body, headers);
  }
  std::string metrics_text() const { return metrics.render(scheduler.gauges()); }

  GatedEngine engine;
  Metrics metrics;
  Scheduler scheduler;
  ApiService service;
  std::unique_ptr<HttpServer> http;
  std::thread thread;
  int port = 0;

 private:
  static ServiceOptions options(const ServerSetup& s) {
    ServiceOptions o;
    o.model_names = {"m"};
    o.keepalive_interval = s.keepalive;
    o.poll_interval = std::chrono::milliseconds(10);
    return o;
  }
};

inline std::string chat_body(bool stream, int max_tokens = 100) {
  return nlohmann::json{{"model", "m"},
                        {"messages", nlohmann::json::array({{{"role", "user"}, {"content", "hi"}}})},
                        {"stream", stream},
                        {"max_tokens", max_tokens}}
      .dump();
}

// Polls `cond` until it holds or `timeout` passes. Deadlines here bound a wait for something that must
// happen; they are generous so that a loaded machine does not fail the test.
inline bool wait_until(const std::function<bool()>& cond,
                       std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return cond();
}

inline void expect_openai_error(const HttpReply& r, int status, const std::string& code) {
  ASSERT_NE(r.status, 0) << "no response";
  EXPECT_EQ(r.status, status) << r.body;
  const nlohmann::json body = nlohmann::json::parse(r.body, nullptr, false);
  ASSERT_TRUE(body.is_object() && body.contains("error")) << r.body;
  EXPECT_TRUE(body["error"]["message"].is_string());
  EXPECT_TRUE(body["error"].contains("type"));
  EXPECT_TRUE(body["error"].contains("param"));
  EXPECT_EQ(body["error"]["code"], code) << r.body;
}

}  // namespace pd::server::testing
