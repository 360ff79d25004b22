// The HTTP layer end to end in-process: routes, auth, limits, queue-full, keep-alive and disconnects.
// Connection-level defences (slow clients, caps, deadlines, huge bodies) are in http_connection_test.cpp.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "puredrive/server/testing/test_server.h"

namespace pd::server {
namespace {

using nlohmann::json;
using testing::chat_body;
using testing::expect_openai_error;
using testing::RawConnection;
using testing::ServerSetup;
using testing::TestServer;
using testing::wait_until;
using namespace std::chrono_literals;

TEST(HttpServer, UnknownRouteAndWrongMethod) {
  TestServer s(ServerSetup{});
  expect_openai_error(s.get("/v1/nothing"), 404, "unknown_url");
  auto r = s.get("/v1/chat/completions");
  expect_openai_error(r, 405, "method_not_allowed");
  EXPECT_EQ(r.header("Allow"), "POST");
  auto r2 = s.post("/v1/models", "{}");
  expect_openai_error(r2, 405, "method_not_allowed");
  EXPECT_EQ(r2.header("Allow"), "GET");
  EXPECT_EQ(s.get("/health").status, 200);
  EXPECT_EQ(json::parse(s.get("/v1/models/m").body)["id"], "m");
}

TEST(HttpServer, ApiKeyIsRequiredOnV1Routes) {
  ServerSetup setup;
  setup.api_key = "sekrit";
  TestServer s(setup);
  expect_openai_error(s.post("/v1/chat/completions", chat_body(false)), 401, "invalid_api_key");
  expect_openai_error(s.get("/v1/models", "Authorization: Bearer wrong\r\n"), 401, "invalid_api_key");
  EXPECT_EQ(s.get("/v1/models", "Authorization: Bearer sekrit\r\n").status, 200);
  auto ok = s.post("/v1/chat/completions", chat_body(false), "Authorization: Bearer sekrit\r\n");
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(json::parse(ok.body)["choices"][0]["message"]["content"], "Hello world");
  EXPECT_EQ(s.get("/health").status, 200);  // health stays open for probes
}

TEST(HttpServer, BodyOverTheLimitIs413) {
  ServerSetup setup;
  setup.max_body = 1024;
  TestServer s(setup);
  expect_openai_error(s.post("/v1/chat/completions", std::string(4096, ' ') + chat_body(false)), 413,
                      "payload_too_large");
  EXPECT_EQ(s.get("/health").status, 200);
}

TEST(HttpServer, KeepAliveServesSeveralRequestsOnOneConnection) {
  TestServer s(ServerSetup{});
  RawConnection c(s.port);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(c.send_request("POST", "/v1/chat/completions", chat_body(i == 1)));
    const auto r = c.read_reply();
    ASSERT_EQ(r.status, 200) << i;
    EXPECT_NE(r.body.find("world"), std::string::npos) << r.body;
    ASSERT_TRUE(c.send_request("GET", "/health"));
    EXPECT_EQ(c.read_reply().status, 200);
  }
}

TEST(HttpServer, FullQueueIs503WithRetryAfter) {
  ServerSetup setup;
  setup.max_queue = 1;
  TestServer s(setup);
  s.engine.close_gate();
  std::thread running([&] { EXPECT_EQ(s.post("/v1/chat/completions", chat_body(false)).status, 200); });
  ASSERT_TRUE(wait_until([&] { return s.engine.started() == 1; }));
  std::thread queued([&] { EXPECT_EQ(s.post("/v1/chat/completions", chat_body(false)).status, 200); });
  ASSERT_TRUE(wait_until([&] { return s.scheduler.gauges().waiting == 1; }));
  auto r = s.post("/v1/chat/completions", chat_body(false));
  expect_openai_error(r, 503, "queue_full");
  EXPECT_FALSE(r.header("Retry-After").empty());
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
    conn.send_request("POST", "/v1/chat/completions", chat_body(true, 2000));
    ASSERT_TRUE(conn.read_until("\"content\":\"x\""));
  }
  ASSERT_TRUE(wait_until([&] { return s.engine.cancelled() == 1; })) << "engine kept generating";
  EXPECT_EQ(s.engine.finished(), 0);
  // The engine is free again.
  s.engine.open_gate();
  auto r = s.post("/v1/completions", json{{"model", "m"}, {"prompt", "a"}, {"max_tokens", 3}}.dump());
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], "xxx");
  EXPECT_NE(s.metrics_text().find("puredrive_generations_total{reason=\"cancelled\"} 1"), std::string::npos);
}

TEST(HttpServer, NonStreamingClientThatHangsUpCancelsItsGeneration) {
  TestServer s(ServerSetup{});
  s.engine.close_gate();  // the request sits in "prefill"
  {
    RawConnection conn(s.port);
    conn.send_request("POST", "/v1/chat/completions", chat_body(false));
    ASSERT_TRUE(wait_until([&] { return s.engine.started() == 1; }));
  }
  ASSERT_TRUE(wait_until([&] { return s.engine.cancelled() == 1; })) << "closed connection not noticed";
  // A client that left is no server error: counted as 499, not in the error counters.
  ASSERT_TRUE(wait_until([&] {
    return s.metrics_text().find("endpoint=\"/v1/chat/completions\",status=\"499\"} 1") != std::string::npos;
  }));
  EXPECT_EQ(s.metrics_text().find("puredrive_errors_total{"), std::string::npos) << s.metrics_text();
}

// The engine keeps producing events without pause (a fast engine), and sits inside one step when the
// client hangs up: the cancellation must reach it before that step ends, so that it stops after it.
TEST(HttpServer, NonStreamingCancellationStopsWithinOneStep) {
  ServerSetup setup;
  setup.script = std::vector<std::string>(100, "x");
  TestServer s(setup);
  s.engine.set_chatter(true);
  s.engine.close_gate(3);
  {
    RawConnection conn(s.port);
    conn.send_request("POST", "/v1/chat/completions", chat_body(false));
    ASSERT_TRUE(wait_until([&] { return s.engine.at_gate(); }));
  }
  EXPECT_TRUE(wait_until([&] { return s.engine.cancel_seen_at_gate(); })) << "cancellation did not arrive";
  s.engine.open_gate();
  ASSERT_TRUE(wait_until([&] { return s.engine.cancelled() == 1; }));
  EXPECT_EQ(s.engine.finished(), 0);
}

// A queued request whose client leaves gives its place in the queue back at once.
TEST(HttpServer, QueuedRequestOfAClientThatLeftFreesItsSlot) {
  ServerSetup setup;
  setup.max_queue = 1;
  TestServer s(setup);
  s.engine.close_gate();
  std::thread running([&] { EXPECT_EQ(s.post("/v1/chat/completions", chat_body(false)).status, 200); });
  ASSERT_TRUE(wait_until([&] { return s.engine.started() == 1; }));
  {
    RawConnection queued(s.port);
    queued.send_request("POST", "/v1/chat/completions", chat_body(false));
    ASSERT_TRUE(wait_until([&] { return s.scheduler.gauges().waiting == 1; }));
  }
  ASSERT_TRUE(wait_until([&] { return s.scheduler.gauges().waiting == 0; })) << "slot not freed";
  std::thread next([&] { EXPECT_EQ(s.post("/v1/chat/completions", chat_body(false)).status, 200); });
  ASSERT_TRUE(wait_until([&] { return s.scheduler.gauges().waiting == 1; }));
  s.engine.open_gate();
  running.join();
  next.join();
}

TEST(HttpServer, QueuedStreamGetsKeepAliveComments) {
  ServerSetup setup;
  setup.keepalive = 30ms;
  TestServer s(setup);
  s.engine.close_gate();
  RawConnection conn(s.port);
  conn.send_request("POST", "/v1/chat/completions", chat_body(true));
  ASSERT_TRUE(conn.read_until(": keep-alive\n\n"));
  s.engine.open_gate();
  ASSERT_TRUE(conn.read_until("data: [DONE]\n\n"));
  EXPECT_NE(conn.received().find("\"content\":\" world\""), std::string::npos);
}

// A prompt that cannot fit the context whatever its tokenization is refused before it is tokenized (the
// message names its length in bytes); one that might fit is tokenized and checked by its token count.
TEST(HttpServer, HopelesslyLongPromptsAreRefusedBeforeTokenizing) {
  TestServer s(ServerSetup{});  // context 64 tokens, longest fake token 13 bytes
  const std::string huge(64 * 13 * 4, 'a');
  for (const auto& [path, body] :
       {std::pair{"/v1/completions", json{{"model", "m"}, {"prompt", huge}}.dump()},
        std::pair{"/v1/chat/completions",
                  json{{"model", "m"}, {"messages", json::array({{{"role", "user"}, {"content", huge}}})}}
                      .dump()}}) {
    const auto r = s.post(path, body);
    expect_openai_error(r, 400, "context_length_exceeded");
    EXPECT_NE(r.body.find("bytes long"), std::string::npos) << r.body;
  }
  const auto r = s.post("/v1/completions", json{{"model", "m"}, {"prompt", std::string(100, 'a')}}.dump());
  expect_openai_error(r, 400, "context_length_exceeded");
  EXPECT_NE(r.body.find("the prompt has 100 tokens"), std::string::npos) << r.body;
}

TEST(HttpServer, BadRequestsLeaveTheServerHealthy) {
  TestServer s(ServerSetup{});
  const std::vector<std::pair<std::string, int>> bodies = {{"not json", 400},
                                                           {"{\"model\":\"m\"}", 400},
                                                           {"{\"model\":\"zzz\",\"messages\":[]}", 404},
                                                           {"", 400},
                                                           {"\xff\xfe", 400}};
  for (const auto& [body, status] : bodies) {
    auto r = s.post("/v1/chat/completions", body);
    EXPECT_EQ(r.status, status) << body;
    EXPECT_TRUE(json::parse(r.body).contains("error"));
    EXPECT_EQ(s.get("/health").status, 200);
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
  auto expect_anthropic_error = [](const testing::HttpReply& r, int status, const char* type) {
    EXPECT_EQ(r.status, status);
    const json j = json::parse(r.body);
    EXPECT_EQ(j["type"], "error") << r.body;
    EXPECT_EQ(j["error"]["type"], type) << r.body;
  };
  expect_anthropic_error(s.post("/v1/messages", body), 401, "authentication_error");
  expect_anthropic_error(s.post("/v1/messages", body, "x-api-key: wrong\r\n"), 401, "authentication_error");
  expect_anthropic_error(s.get("/v1/messages", "x-api-key: sekrit\r\n"), 405, "invalid_request_error");
  const std::string anthropic = "x-api-key: sekrit\r\nanthropic-version: 2023-06-01\r\n";
  auto ok = s.post("/v1/messages", body, anthropic);
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(json::parse(ok.body)["content"][0]["text"], "Hello world");
  auto count = s.post("/v1/messages/count_tokens", body, anthropic);
  EXPECT_EQ(count.status, 200) << count.body;
  EXPECT_GT(json::parse(count.body)["input_tokens"].get<int>(), 0);
  // x-api-key works on the OpenAI routes too, and Bearer on Anthropic's.
  EXPECT_EQ(s.get("/v1/models", anthropic).status, 200);
  EXPECT_EQ(s.post("/v1/messages", body, "Authorization: Bearer sekrit\r\n").status, 200);
  // The HTTP layer's own errors on Anthropic's routes are in Anthropic's shape too.
  const auto too_large = s.post("/v1/messages", std::string(2 << 20, ' '), anthropic);
  EXPECT_EQ(too_large.status, 413);
  EXPECT_EQ(json::parse(too_large.body)["type"], "error") << too_large.body;
}

}  // namespace
}  // namespace pd::server
