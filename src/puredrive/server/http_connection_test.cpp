// Connection-level defences of the HTTP server (docs/API.md, "Connections"): clients that send their
// headers slowly or not at all cannot starve others; deadlines are totals, not per-read timeouts; caps per
// client address and in all; a fast 503 when every handler is taken; body limits that hold for chunked
// bodies; Expect: 100-continue only for bodies that will be accepted. Other clients act from other
// loopback addresses (127.0.0.x), as separate machines would.
#include <sys/socket.h>

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
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::string address(int i) {
  return "127.0.0." + std::to_string(2 + i % 250);
}

// Nothing to read and not closed: the server still holds the connection open.
bool still_open(const RawConnection& c) {
  char byte = 0;
  const ssize_t n = recv(c.fd(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

TEST(HttpConnections, TwoHundredSlowHeaderClientsDoNotStarveOthers) {
  ServerSetup setup;
  setup.read_timeout_seconds = 120;  // the slow clients stay for the whole test
  TestServer s(setup);
  std::vector<std::unique_ptr<RawConnection>> slow;
  for (int i = 0; i < 200; ++i) {
    slow.push_back(std::make_unique<RawConnection>(s.port, address(i).c_str()));
    ASSERT_TRUE(slow.back()->connected()) << i;
    ASSERT_TRUE(slow.back()->send("GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: "));
  }
  std::atomic<bool> done{false};
  std::thread trickle([&] {  // one header byte per connection every 100 ms
    while (!done.load()) {
      for (auto& c : slow) c->send("a");
      std::this_thread::sleep_for(100ms);
    }
  });
  for (int round = 0; round < 3; ++round) {
    auto t0 = Clock::now();
    EXPECT_EQ(s.get("/health").status, 200);
    EXPECT_LT(Clock::now() - t0, 2s);
    t0 = Clock::now();
    const auto r = s.post("/v1/chat/completions", chat_body(false));
    EXPECT_LT(Clock::now() - t0, 2s);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["choices"][0]["message"]["content"], "Hello world");
  }
  done = true;
  trickle.join();
  for (int i = 0; i < 200; i += 40) EXPECT_TRUE(still_open(*slow[i])) << i;
}

// A client that keeps sending one header byte at a time is dropped at the header deadline all the same.
TEST(HttpConnections, HeaderDeadlineIsATotal) {
  ServerSetup setup;
  setup.read_timeout_seconds = 1;
  TestServer s(setup);
  RawConnection c(s.port, nullptr, /*recv_timeout_seconds=*/1);
  ASSERT_TRUE(c.send("GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: "));
  const auto deadline = Clock::now() + 20s;
  bool dropped = false;
  while (!dropped && Clock::now() < deadline) {
    std::this_thread::sleep_for(100ms);
    dropped = !c.send("a") || !still_open(c);
  }
  EXPECT_TRUE(dropped) << "a trickling client kept its connection past the header deadline";
}

// The same for a body: a deadline for all of it (--read-timeout plus a second per MiB), not per read.
TEST(HttpConnections, BodyDeadlineIsATotal) {
  ServerSetup setup;
  setup.read_timeout_seconds = 1;
  TestServer s(setup);
  RawConnection c(s.port, nullptr, /*recv_timeout_seconds=*/1);
  ASSERT_TRUE(c.send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{"));
  const auto deadline = Clock::now() + 20s;
  bool dropped = false;
  while (!dropped && Clock::now() < deadline) {
    std::this_thread::sleep_for(100ms);
    dropped = !c.send(" ") || !still_open(c);
  }
  EXPECT_TRUE(dropped) << "a trickling body kept its connection past the body deadline";
}

TEST(HttpConnections, IdleKeepAliveConnectionsAreClosed) {
  ServerSetup setup;
  setup.idle_timeout_seconds = 1;
  TestServer s(setup);
  RawConnection c(s.port, nullptr, /*recv_timeout_seconds=*/20);
  ASSERT_TRUE(c.send_request("GET", "/health"));
  ASSERT_EQ(c.read_reply().status, 200);
  EXPECT_TRUE(c.closed_by_peer());
}

TEST(HttpConnections, CapPerClientAddress) {
  ServerSetup setup;
  setup.read_timeout_seconds = 120;
  setup.max_connections_per_client = 4;
  TestServer s(setup);
  std::vector<std::unique_ptr<RawConnection>> held;
  for (int i = 0; i < 4; ++i) held.push_back(std::make_unique<RawConnection>(s.port, "127.0.0.9"));
  // The server counts a connection when it accepts it: wait until the fourth one is in.
  RawConnection probe(s.port, "127.0.0.9");
  const auto refused = probe.read_reply();
  expect_openai_error(refused, 503, "too_many_connections");
  EXPECT_FALSE(refused.header("Retry-After").empty());
  EXPECT_EQ(s.get("/health").status, 200);  // another address is served
  held.pop_back();
  EXPECT_TRUE(wait_until([&] {
    RawConnection again(s.port, "127.0.0.9");
    again.send_request("GET", "/health");
    return again.read_reply().status == 200;
  })) << "a closed connection was not given back to its address";
}

TEST(HttpConnections, CapInAll) {
  ServerSetup setup;
  setup.read_timeout_seconds = 120;
  setup.max_connections = 3;
  TestServer s(setup);
  std::vector<std::unique_ptr<RawConnection>> held;
  for (int i = 0; i < 3; ++i) held.push_back(std::make_unique<RawConnection>(s.port, address(i).c_str()));
  RawConnection probe(s.port, address(10).c_str());
  expect_openai_error(probe.read_reply(), 503, "too_many_connections");
}

TEST(HttpConnections, Fast503WhenEveryHandlerIsTaken) {
  ServerSetup setup;
  setup.threads = 2;
  TestServer s(setup);
  s.engine.close_gate();
  std::thread a([&] { EXPECT_EQ(s.post("/v1/chat/completions", chat_body(false)).status, 200); });
  std::thread b([&] { EXPECT_EQ(s.post("/v1/chat/completions", chat_body(false)).status, 200); });
  ASSERT_TRUE(wait_until([&] { return s.scheduler.gauges().waiting == 1 && s.engine.started() == 1; }));
  const auto r = s.post("/v1/chat/completions", chat_body(false));
  expect_openai_error(r, 503, "server_busy");
  EXPECT_FALSE(r.header("Retry-After").empty());
  EXPECT_EQ(s.get("/health").status, 200);  // cheap routes do not need a handler thread
  s.engine.open_gate();
  a.join();
  b.join();
}

TEST(HttpConnections, ChunkedBodyOverTheLimitIs413) {
  ServerSetup setup;
  setup.max_body = 64 * 1024;
  TestServer s(setup);
  RawConnection c(s.port);
  ASSERT_TRUE(c.send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"));
  const std::string chunk = "4000\r\n" + std::string(0x4000, ' ') + "\r\n";
  size_t sent = 0;
  // Sends until the server answers or stops reading; it must not take the whole (endless) body.
  while (sent < (256u << 20) && still_open(c) && c.send(chunk)) sent += chunk.size();
  EXPECT_LT(sent, 256u << 20) << "the server kept reading";
  expect_openai_error(c.read_reply(), 413, "payload_too_large");
}

TEST(HttpConnections, MalformedFramingIs400AtOnce) {
  TestServer s(ServerSetup{});
  for (const std::string head : {"Content-Length: -1\r\n", "Content-Length: 1x\r\n", "NoColonHere\r\n",
                                 "Content-Length: 2\r\nContent-Length: 3\r\n"}) {
    RawConnection c(s.port);
    c.send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + head + "\r\n{}");
    const auto t0 = Clock::now();
    expect_openai_error(c.read_reply(), 400, "bad_http_request");
    EXPECT_LT(Clock::now() - t0, 5s) << head;  // answered, not left to time out
  }
  EXPECT_EQ(s.get("/health").status, 200);
}

TEST(HttpConnections, ExpectContinueOnlyForAcceptableBodies) {
  ServerSetup setup;
  setup.max_body = 4096;
  TestServer s(setup);
  {
    RawConnection c(s.port);
    c.send(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
        "Content-Length: 400000000\r\n\r\n");
    const auto r = c.read_reply();
    expect_openai_error(r, 413, "payload_too_large");
    EXPECT_EQ(c.received().find("100 Continue"), std::string::npos);
  }
  {
    RawConnection c(s.port);
    const std::string body = chat_body(false);
    c.send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n");
    ASSERT_TRUE(c.read_until("HTTP/1.1 100 Continue\r\n\r\n"));
    c.send(body);
    ASSERT_TRUE(c.read_until("Hello world"));
  }
}

TEST(HttpConnections, OversizedUrlAndHeader) {
  TestServer s(ServerSetup{});
  expect_openai_error(s.get("/" + std::string(20000, 'a')), 414, "uri_too_long");
  expect_openai_error(s.get("/health", "X-Big: " + std::string(100000, 'a') + "\r\n"), 400,
                      "bad_http_request");
  expect_openai_error(s.get("/health", "X-Big: " + std::string(9000, 'a') + "\r\n"), 400, "bad_http_request");
  EXPECT_EQ(s.get("/health").status, 200);
}

}  // namespace
}  // namespace pd::server
