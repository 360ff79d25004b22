// Internal to http_server.cpp and http_session.cpp: one client connection (Session), the handler thread
// pool, and the state they share with the server (ServerCore).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without it
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "puredrive/server/http_router.h"
#include "puredrive/server/http_server.h"

namespace pd::server::http_detail {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;

// A fixed set of threads for handlers that block (tokenizing, waiting for the engine, streaming). A task is
// taken only when a thread is free for it, so a saturated server answers 503 at once instead of queueing
// work that nobody would wait for.
class HandlerPool {
 public:
  explicit HandlerPool(int threads);
  ~HandlerPool();
  bool try_submit(std::function<void()> task);
  // Runs what was submitted, then joins the threads.
  void shutdown();

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  const size_t size_;
  size_t busy_ = 0;  // tasks queued or running
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

class Session;

struct ServerCore {
  ServerCore(HttpOptions o, ApiService& service, Metrics& m)
      : options(std::move(o)),
        router(options.api_key, options.max_body_bytes, service),
        metrics(m),
        pool(options.threads) {}

  // Counts a new connection from `client`; false when a cap is reached.
  bool admit_connection(const std::string& client);
  void release_connection(const std::string& client);
  void add_session(const std::shared_ptr<Session>& s);
  void remove_session(Session* s);
  // Closes every open connection (server stop).
  void close_sessions();

  HttpOptions options;
  HttpRouter router;
  Metrics& metrics;
  HandlerPool pool;
  std::atomic<bool> stopping{false};

 private:
  std::mutex mu_;
  std::unordered_map<std::string, int> per_client_;
  int open_ = 0;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions_;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, ServerCore& core, std::string client);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void start();
  // From any thread: closes the connection; a running handler sees its client gone.
  void close_from_outside();

  // Handler side (any thread), for the request numbered `serial`.
  bool gone() const { return gone_.load(); }
  void set_gone_callback(uint64_t serial, std::function<void()> f);
  bool write_and_wait(std::string bytes);  // false when the write failed or the client is gone
  void post_reply(Reply reply, uint64_t serial);
  void post_stream_end(bool ok, uint64_t serial);

 private:
  using Parser = http::request_parser<http::string_body>;

  void read_request();
  void read_header();
  void on_header(beast::error_code ec);
  void read_body();
  void on_body(beast::error_code ec);
  void dispatch();
  void run_on_handler_thread(HttpRouter::Route route);
  void watch_peer(uint64_t serial);
  void mark_gone();

  // Writes a whole response; `close` ends the connection after it (with a lingering close when the
  // client may still be sending).
  void respond(const Reply& reply, bool close);
  void fail(HttpFailure f, std::string_view path);
  std::string head_bytes(int status, const Reply& reply, bool chunked, bool close) const;
  void write(std::shared_ptr<std::string> bytes, std::function<void(bool)> done);
  void after_response(bool close);
  void linger_then_close();
  void close_now();

  tcp::socket& socket() { return stream_.socket(); }

  beast::tcp_stream stream_;
  ServerCore& core_;
  const std::string client_;
  beast::flat_buffer buffer_;
  std::optional<Parser> parser_;
  HttpRequest request_;
  HttpRouter::Route route_;  // of the request being read
  std::string label_;        // its metrics label
  bool keep_alive_ = false;
  bool body_read_ = false;
  int requests_ = 0;
  bool closed_ = false;

  std::atomic<bool> gone_{false};
  std::atomic<uint64_t> serial_{0};  // the request a handler is working on
  std::mutex gone_mu_;
  std::function<void()> gone_callback_;
  uint64_t gone_serial_ = 0;
};

}  // namespace pd::server::http_detail
