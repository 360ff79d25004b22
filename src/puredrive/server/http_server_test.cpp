// The HTTP layer end to end in-process: routes, auth, limits, queue-full, keep-alive and disconnects.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "puredrive/server/http_server.h"
#include "puredrive/server/testing/fake_frontend.h"
#include "puredrive/server/testing/test_engines.h"

namespace pd::server {
namespace {

using nlohmann::json;
using testing::GatedEngine;
using namespace std::chrono_literals;

struct ServerSetup {
  size_t max_queue = 8;
  std::string api_key;
  size_t max_body = 1 << 20;
  std::chrono::milliseconds keepalive{3000};
  std::vector<std::string> script = {"Hello", " world"};
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
    h.read_timeout_seconds = 1;
    h.threads = 16;
    http = std::make_unique<HttpServer>(h, service, metrics);
    auto p = http->bind();
    EXPECT_TRUE(p.has_value());
    port = *p;
    thread = std::thread([this] { http->run(); });
  }
  ~TestServer() {
    engine.open_gate();
    http->stop();
    thread.join();
    scheduler.shutdown();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(10, 0);
    return c;
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
    o.poll_interval = 10ms;
    return o;
  }
};

std::string chat_body(bool stream, int max_tokens = 100) {
  return json{{"model", "m"},
              {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
              {"stream", stream},
              {"max_tokens", max_tokens}}
      .dump();
}

// A raw TCP connection, for what httplib::Client cannot do: read part of a stream and hang up.
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    timeval tv{.tv_sec = 5, .tv_usec = 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~RawConnection() { close(); }
  bool connected() const { return connected_; }
  void send_post(const std::string& path, const std::string& body) {
    const std::string req = "POST " + path +
                            " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                            std::to_string(body.size()) + "\r\n\r\n" + body;
    ASSERT_EQ(::send(fd_, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  }
  // Reads until `needle` was seen (true) or the connection closed / timed out (false).
  bool read_until(const std::string& needle) {
    char buf[4096];
    while (received_.find(needle) == std::string::npos) {
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return false;
      received_.append(buf, static_cast<size_t>(n));
    }
    return true;
  }
  const std::string& received() const { return received_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  std::string received_;
};

bool wait_until(const std::function<bool()>& cond, std::chrono::milliseconds timeout = 5s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return cond();
}

void expect_openai_error(const httplib::Result& r, int status, const std::string& code) {
  ASSERT_TRUE(r) << "no response";
  EXPECT_EQ(r->status, status);
  const json body = json::parse(r->body);
  ASSERT_TRUE(body.contains("error")) << r->body;
  EXPECT_TRUE(body["error"]["message"].is_string());
  EXPECT_TRUE(body["error"].contains("type"));
  EXPECT_TRUE(body["error"].contains("param"));
  EXPECT_EQ(body["error"]["code"], code) << r->body;
}

TEST(HttpServer, UnknownRouteAndWrongMethod) {
  TestServer s(ServerSetup{});
  auto c = s.client();
  expect_openai_error(c.Get("/v1/nothing"), 404, "unknown_url");
  auto r = c.Get("/v1/chat/completions");
  expect_openai_error(r, 405, "method_not_allowed");
  EXPECT_EQ(r->get_header_value("Allow"), "POST");
  auto r2 = c.Post("/v1/models", "{}", "application/json");
  expect_openai_error(r2, 405, "method_not_allowed");
  EXPECT_EQ(r2->get_header_value("Allow"), "GET");
  EXPECT_EQ(c.Get("/health")->status, 200);
}

TEST(HttpServer, ApiKeyIsRequiredOnV1Routes) {
  ServerSetup setup;
  setup.api_key = "sekrit";
  TestServer s(setup);
  auto c = s.client();
  auto r = c.Post("/v1/chat/completions", chat_body(false), "application/json");
  expect_openai_error(r, 401, "invalid_api_key");
  c.set_bearer_token_auth("wrong");
  expect_openai_error(c.Get("/v1/models"), 401, "invalid_api_key");
  c.set_bearer_token_auth("sekrit");
  EXPECT_EQ(c.Get("/v1/models")->status, 200);
  auto ok = c.Post("/v1/chat/completions", chat_body(false), "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(json::parse(ok->body)["choices"][0]["message"]["content"], "Hello world");
  httplib::Client anon("127.0.0.1", s.port);
  EXPECT_EQ(anon.Get("/health")->status, 200);  // health stays open for probes
}

TEST(HttpServer, BodyOverTheLimitIs413) {
  ServerSetup setup;
  setup.max_body = 1024;
  TestServer s(setup);
  auto c = s.client();
  expect_openai_error(
      c.Post("/v1/chat/completions", std::string(4096, ' ') + chat_body(false), "application/json"), 413,
      "payload_too_large");
  EXPECT_EQ(c.Get("/health")->status, 200);
}

TEST(HttpServer, FullQueueIs503WithRetryAfter) {
  ServerSetup setup;
  setup.max_queue = 1;
  TestServer s(setup);
  s.engine.close_gate();
  std::thread running([&] {
    EXPECT_EQ(s.client().Post("/v1/chat/completions", chat_body(false), "application/json")->status, 200);
  });
  ASSERT_TRUE(wait_until([&] { return s.engine.started() == 1; }));
  std::thread queued([&] {
    EXPECT_EQ(s.client().Post("/v1/chat/completions", chat_body(false), "application/json")->status, 200);
  });
  ASSERT_TRUE(wait_until([&] { return s.scheduler.gauges().waiting == 1; }));
  auto r = s.client().Post("/v1/chat/completions", chat_body(false), "application/json");
  expect_openai_error(r, 503, "queue_full");
  EXPECT_FALSE(r->get_header_value("Retry-After").empty());
  s.engine.open_gate();
  running.join();
  queued.join();
  EXPECT_NE(s.metrics_text().find(
                "puredrive_http_requests_total{endpoint=\"/v1/chat/completions\",status=\"503\"} 1"),
            std::string::npos);
}

TEST(HttpServer, StreamingClientThatHangsUpCancelsItsGeneration) {
  ServerSetup setup;
  setup.script = std::vector<std::string>(2000, "x");
  TestServer s(setup);
  s.engine.close_gate(1);  // the engine stays mid-stream, after the first token, until cancelled
  {
    RawConnection conn(s.port);
    ASSERT_TRUE(conn.connected());
    conn.send_post("/v1/chat/completions", chat_body(true, 2000));
    ASSERT_TRUE(conn.read_until("\"content\":\"x\""));
  }
  ASSERT_TRUE(wait_until([&] { return s.engine.cancelled() == 1; }, 3s)) << "engine kept generating";
  EXPECT_EQ(s.engine.finished(), 0);
  // The engine is free again.
  s.engine.open_gate();
  auto r = s.client().Post("/v1/completions", json{{"model", "m"}, {"prompt", "a"}, {"max_tokens", 3}}.dump(),
                           "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], "xxx");
  EXPECT_NE(s.metrics_text().find("puredrive_generations_total{reason=\"cancelled\"} 1"), std::string::npos);
}

TEST(HttpServer, NonStreamingClientThatHangsUpCancelsItsGeneration) {
  TestServer s(ServerSetup{});
  s.engine.close_gate();  // the request sits in "prefill"
  {
    RawConnection conn(s.port);
    conn.send_post("/v1/chat/completions", chat_body(false));
    ASSERT_TRUE(wait_until([&] { return s.engine.started() == 1; }));
  }
  ASSERT_TRUE(wait_until([&] { return s.engine.cancelled() == 1; }, 3s)) << "closed connection not noticed";
}

TEST(HttpServer, QueuedStreamGetsKeepAliveComments) {
  ServerSetup setup;
  setup.keepalive = 30ms;
  TestServer s(setup);
  s.engine.close_gate();
  RawConnection conn(s.port);
  conn.send_post("/v1/chat/completions", chat_body(true));
  ASSERT_TRUE(conn.read_until(": keep-alive\n\n"));
  s.engine.open_gate();
  ASSERT_TRUE(conn.read_until("data: [DONE]\n\n"));
  EXPECT_NE(conn.received().find("\"content\":\" world\""), std::string::npos);
}

TEST(HttpServer, BadRequestsLeaveTheServerHealthy) {
  TestServer s(ServerSetup{});
  auto c = s.client();
  const std::vector<std::pair<std::string, int>> bodies = {{"not json", 400},
                                                           {"{\"model\":\"m\"}", 400},
                                                           {"{\"model\":\"zzz\",\"messages\":[]}", 404},
                                                           {"", 400},
                                                           {"\xff\xfe", 400}};
  for (const auto& [body, status] : bodies) {
    auto r = c.Post("/v1/chat/completions", body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, status) << body;
    EXPECT_TRUE(json::parse(r->body).contains("error"));
    EXPECT_EQ(c.Get("/health")->status, 200);
  }
}

// Anthropic's routes: x-api-key as well as Bearer, errors (the HTTP layer's own too) in Anthropic's shape.
TEST(HttpServer, AnthropicRoutesTakeXApiKeyAndAnswerInAnthropicShape) {
  ServerSetup setup;
  setup.api_key = "sekrit";
  TestServer s(setup);
  const std::string body = json{{"model", "m"},
                                {"max_tokens", 16},
                                {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}}
                               .dump();
  auto expect_anthropic_error = [](const httplib::Result& r, int status, const char* type) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, status);
    const json j = json::parse(r->body);
    EXPECT_EQ(j["type"], "error") << r->body;
    EXPECT_EQ(j["error"]["type"], type) << r->body;
  };
  auto c = s.client();
  expect_anthropic_error(c.Post("/v1/messages", body, "application/json"), 401, "authentication_error");
  expect_anthropic_error(
      c.Post("/v1/messages", httplib::Headers{{"x-api-key", "wrong"}}, body, "application/json"), 401,
      "authentication_error");
  expect_anthropic_error(c.Get("/v1/messages", httplib::Headers{{"x-api-key", "sekrit"}}), 405,
                         "invalid_request_error");
  const httplib::Headers anthropic = {{"x-api-key", "sekrit"}, {"anthropic-version", "2023-06-01"}};
  auto ok = c.Post("/v1/messages", anthropic, body, "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_EQ(json::parse(ok->body)["content"][0]["text"], "Hello world");
  auto count = c.Post("/v1/messages/count_tokens", anthropic, body, "application/json");
  ASSERT_TRUE(count);
  EXPECT_EQ(count->status, 200) << count->body;
  EXPECT_GT(json::parse(count->body)["input_tokens"].get<int>(), 0);
  // x-api-key works on the OpenAI routes too, and Bearer on Anthropic's.
  EXPECT_EQ(c.Get("/v1/models", anthropic)->status, 200);
  c.set_bearer_token_auth("sekrit");
  EXPECT_EQ(c.Post("/v1/messages", body, "application/json")->status, 200);
}

}  // namespace
}  // namespace pd::server
