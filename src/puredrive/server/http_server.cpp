#include "puredrive/server/http_server.h"

#include <sys/resource.h>
#include <sys/socket.h>

#include <fmt/format.h>

#include "puredrive/server/http_session.h"
#include "puredrive/util/log.h"

namespace pd::server {

using namespace http_detail;

namespace http_detail {

HandlerPool::HandlerPool(int threads) : size_(static_cast<size_t>(threads)) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { loop(); });
}

HandlerPool::~HandlerPool() {
  shutdown();
}

bool HandlerPool::try_submit(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    // Counted from the tasks taken, not from the threads seen waiting: a thread that has not reached its
    // first wait yet (at start, on a loaded machine) is free all the same.
    if (stopping_ || busy_ >= size_) return false;
    ++busy_;
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
  return true;
}

void HandlerPool::shutdown() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void HandlerPool::loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stopping, nothing left
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    task = nullptr;  // whatever it holds (a session) is released outside the lock
    lock.lock();
    --busy_;
  }
}

bool ServerCore::admit_connection(const std::string& client) {
  std::lock_guard lock(mu_);
  int& mine = per_client_[client];
  if (open_ >= options.max_connections || mine >= options.max_connections_per_client) {
    if (mine == 0) per_client_.erase(client);
    return false;
  }
  ++mine;
  ++open_;
  return true;
}

void ServerCore::release_connection(const std::string& client) {
  std::lock_guard lock(mu_);
  --open_;
  auto it = per_client_.find(client);
  if (it != per_client_.end() && --it->second <= 0) per_client_.erase(it);
}

void ServerCore::add_session(const std::shared_ptr<Session>& s) {
  std::lock_guard lock(mu_);
  sessions_[s.get()] = s;
}

void ServerCore::remove_session(Session* s) {
  std::lock_guard lock(mu_);
  sessions_.erase(s);
}

void ServerCore::close_sessions() {
  std::vector<std::shared_ptr<Session>> open;
  {
    std::lock_guard lock(mu_);
    for (auto& [p, weak] : sessions_) {
      if (auto s = weak.lock()) open.push_back(std::move(s));
    }
  }
  for (auto& s : open) s->close_from_outside();
}

}  // namespace http_detail

struct HttpServer::Impl {
  Impl(HttpOptions o, ApiService& service, Metrics& metrics)
      : core(std::move(o), service, metrics), acceptor(ioc), retry_timer(ioc) {
    // The answer to a connection over a cap is written before anything is read: prepared once.
    const ApiError e = core.router.failure_error(HttpFailure::kTooManyConnections);
    const std::string body = e.to_json();
    refusal = fmt::format(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {}\r\n"
        "Retry-After: 2\r\nConnection: close\r\n\r\n{}",
        body.size(), body);
  }

  void accept() {
    acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
      if (core.stopping.load() || !acceptor.is_open()) return;
      if (ec) {
        // Out of descriptors or the like: try again shortly instead of spinning.
        retry_timer.expires_after(std::chrono::milliseconds(50));
        retry_timer.async_wait([this](beast::error_code) { accept(); });
        return;
      }
      on_connection(std::move(socket));
      accept();
    });
  }

  void on_connection(tcp::socket socket) {
    beast::error_code ec;
    const auto peer = socket.remote_endpoint(ec);
    if (ec) return;
    std::string client = peer.address().to_string();
    if (!core.admit_connection(client)) {
      // Best effort and without blocking: the refusal fits any socket buffer.
      [[maybe_unused]] const ssize_t n =
          ::send(socket.native_handle(), refusal.data(), refusal.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      core.metrics.on_http_response("other", 503);
      core.metrics.on_error("too_many_connections");
      socket.shutdown(tcp::socket::shutdown_send, ec);
      socket.close(ec);
      return;
    }
    auto session = std::make_shared<Session>(std::move(socket), core, std::move(client));
    core.add_session(session);
    session->start();
  }

  ServerCore core;
  std::string refusal;
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stop_requested = false;
  // Last: destroyed first, with the handlers it still holds (which hold sessions, which use `core`).
  net::io_context ioc;
  tcp::acceptor acceptor;
  net::steady_timer retry_timer;
};

HttpServer::HttpServer(HttpOptions options, ApiService& service, Metrics& metrics)
    : impl_(std::make_unique<Impl>(std::move(options), service, metrics)) {}

HttpServer::~HttpServer() {
  stop();
}

Expected<int> HttpServer::bind() {
  Impl& s = *impl_;
  beast::error_code ec;
  const std::string& host = s.core.options.host;
  tcp::resolver resolver(s.ioc);
  auto results = resolver.resolve(host, std::to_string(s.core.options.port),
                                  tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) return make_error(ErrorCode::kIo, "cannot resolve {}: {}", host, ec.message());
  const tcp::endpoint endpoint = results.begin()->endpoint();
  s.acceptor.open(endpoint.protocol(), ec);
  if (!ec) s.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) s.acceptor.bind(endpoint, ec);
  if (!ec) s.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return make_error(ErrorCode::kIo, "cannot bind {}:{} ({}: in use, or not an address of this machine)",
                      host, s.core.options.port, ec.message());
  }
  return static_cast<int>(s.acceptor.local_endpoint().port());
}

void HttpServer::run() {
  Impl& s = *impl_;
  // Every connection is a descriptor: allow as many as the caps can open.
  rlimit fds{};
  if (getrlimit(RLIMIT_NOFILE, &fds) == 0 && fds.rlim_cur < fds.rlim_max) {
    fds.rlim_cur = fds.rlim_max;
    setrlimit(RLIMIT_NOFILE, &fds);
  }
  auto guard = net::make_work_guard(s.ioc);
  s.accept();
  std::vector<std::thread> io;
  for (int i = 0; i < std::max(1, s.core.options.io_threads); ++i) io.emplace_back([&s] { s.ioc.run(); });
  {
    std::unique_lock lock(s.stop_mu);
    s.stop_cv.wait(lock, [&] { return s.stop_requested; });
  }
  // Stop taking connections, close the open ones, and let the handlers finish (their writes fail and their
  // generations are cancelled) while the I/O threads still run.
  s.core.stopping.store(true);
  net::post(s.ioc, [&s] {
    beast::error_code ignored;
    s.acceptor.close(ignored);
    s.retry_timer.cancel();
  });
  s.core.close_sessions();
  s.core.pool.shutdown();
  s.core.close_sessions();  // connections that finished a request meanwhile
  guard.reset();
  s.ioc.stop();
  for (auto& t : io) t.join();
}

void HttpServer::stop() {
  Impl& s = *impl_;
  {
    std::lock_guard lock(s.stop_mu);
    s.stop_requested = true;
  }
  s.stop_cv.notify_all();
}

}  // namespace pd::server
