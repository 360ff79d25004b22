#include "puredrive/server/http_session.h"

#include <malloc.h>
#include <sys/socket.h>

#include <cctype>
#include <cerrno>
#include <future>

#include <fmt/format.h>

#include "puredrive/util/log.h"

namespace pd::server::http_detail {
namespace {

constexpr size_t kMaxTargetBytes = 8192;
constexpr size_t kMaxFieldBytes = 8192;
constexpr uint32_t kMaxHeaderBytes = 64 * 1024;
constexpr size_t kFirstRead = 4096;
// After an error answer the client may still be sending: its bytes are read and dropped this long, so
// that closing does not reset the connection before the client has read the answer.
constexpr auto kLinger = std::chrono::seconds(2);
// Bodies above this give their memory back to the system once the request is done.
constexpr size_t kTrimAfterBytes = 1u << 20;

// A connection that a handler answers: writes and liveness go through its session.
class HandlerConnection final : public ClientConnection {
 public:
  HandlerConnection(std::shared_ptr<Session> s, uint64_t serial) : session_(std::move(s)), serial_(serial) {}
  ~HandlerConnection() override { session_->set_gone_callback(serial_, nullptr); }

  bool write(std::string_view data) override {
    if (data.empty()) return !session_->gone();  // an empty chunk would end the stream
    std::string frame = fmt::format("{:x}\r\n", data.size());
    frame.append(data);
    frame += "\r\n";
    return session_->write_and_wait(std::move(frame));
  }
  bool alive() override { return !session_->gone(); }
  void on_gone(std::function<void()> cancel) override {
    session_->set_gone_callback(serial_, std::move(cancel));
  }

 private:
  std::shared_ptr<Session> session_;
  uint64_t serial_;
};

// Inline routes never stream and never wait for the engine.
class InlineConnection final : public ClientConnection {
 public:
  bool write(std::string_view) override { return false; }
  bool alive() override { return true; }
};

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  }
  return true;
}

}  // namespace

Session::Session(tcp::socket socket, ServerCore& core, std::string client)
    : stream_(std::move(socket)), core_(core), client_(std::move(client)), buffer_(kMaxHeaderBytes * 2) {}

Session::~Session() {
  core_.remove_session(this);
  core_.release_connection(client_);
}

void Session::start() {
  beast::error_code ignored;
  socket().set_option(tcp::no_delay(true), ignored);  // SSE chunks and small replies go out at once
  read_request();
}

void Session::close_from_outside() {
  net::post(stream_.get_executor(), [self = shared_from_this()] {
    self->mark_gone();
    self->close_now();
  });
}

void Session::read_request() {
  if (closed_) return;
  ++serial_;
  request_ = HttpRequest{};
  label_ = HttpRouter::endpoint_label("");
  body_read_ = false;
  parser_.emplace();
  parser_->header_limit(kMaxHeaderBytes);
  parser_->body_limit(core_.options.max_body_bytes);
  if (buffer_.size() > 0) {  // a pipelined request is already here
    stream_.expires_after(std::chrono::seconds(core_.options.read_timeout_seconds));
    read_header();
    return;
  }
  // A new connection has --read-timeout for its whole first request head; a kept-alive one may first
  // wait up to the idle timeout for the next request to begin.
  const int wait = requests_ == 0 ? core_.options.read_timeout_seconds : core_.options.idle_timeout_seconds;
  stream_.expires_after(std::chrono::seconds(wait));
  stream_.async_read_some(
      buffer_.prepare(kFirstRead), [self = shared_from_this()](beast::error_code ec, size_t n) {
        if (ec) return self->close_now();  // closed, reset or idle too long: no answer
        self->buffer_.commit(n);
        if (self->requests_ > 0) {
          self->stream_.expires_after(std::chrono::seconds(self->core_.options.read_timeout_seconds));
        }
        self->read_header();
      });
}

void Session::read_header() {
  http::async_read_header(stream_, buffer_, *parser_,
                          [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
}

void Session::on_header(beast::error_code ec) {
  if (ec == beast::error::timeout || ec == http::error::end_of_stream || ec == net::error::eof ||
      ec == http::error::partial_message || ec == net::error::operation_aborted ||
      ec == net::error::connection_reset) {
    return close_now();  // too slow or gone: nobody to answer
  }
  if (ec == http::error::body_limit) {  // the declared length is over the limit: the head itself is complete
    const std::string_view target = parser_->get().target();
    return fail(HttpFailure::kBodyTooLarge, target.substr(0, target.find('?')));
  }
  if (ec) return fail(HttpFailure::kBadRequest, "");
  const auto& msg = parser_->get();
  request_.method = std::string(msg.method_string());
  const std::string_view target = msg.target();
  request_.path = std::string(target.substr(0, target.find('?')));
  label_ = HttpRouter::endpoint_label(request_.path);
  if (target.size() > kMaxTargetBytes) return fail(HttpFailure::kUriTooLong, "");
  for (const auto& field : msg) {
    if (field.value().size() > kMaxFieldBytes) return fail(HttpFailure::kBadRequest, request_.path);
  }
  if (msg.method() == http::verb::unknown || target.empty() || target[0] != '/') {
    return fail(HttpFailure::kBadRequest, request_.path);
  }
  request_.authorization = std::string(msg[http::field::authorization]);
  request_.x_api_key = std::string(msg["x-api-key"]);
  keep_alive_ = parser_->keep_alive() && requests_ + 1 < core_.options.max_requests_per_connection;

  route_ = core_.router.route(request_);
  const HttpRouter::Route& route = route_;
  const bool has_body = parser_->chunked() || parser_->content_length().value_or(0) > 0;
  if (!route.handler) return respond(route.early, has_body || !keep_alive_);
  if (parser_->content_length().value_or(0) > core_.options.max_body_bytes) {
    return fail(HttpFailure::kBodyTooLarge, request_.path);
  }
  if (has_body && iequals(msg[http::field::expect], "100-continue")) {
    // Only now, with the route, the key and the declared size accepted, is the client asked for its body.
    auto cont = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
    return write(cont, [self = shared_from_this()](bool ok) {
      if (!ok) return self->close_now();
      self->read_body();
    });
  }
  read_body();
}

void Session::read_body() {
  const uint64_t declared = parser_->content_length().value_or(core_.options.max_body_bytes);
  stream_.expires_after(std::chrono::seconds(core_.options.read_timeout_seconds) +
                        std::chrono::seconds(declared >> 20));
  http::async_read(stream_, buffer_, *parser_,
                   [self = shared_from_this()](beast::error_code ec, size_t) { self->on_body(ec); });
}

void Session::on_body(beast::error_code ec) {
  if (ec == http::error::body_limit) return fail(HttpFailure::kBodyTooLarge, request_.path);
  if (ec == beast::error::timeout || ec == http::error::partial_message || ec == net::error::eof ||
      ec == net::error::operation_aborted || ec == net::error::connection_reset) {
    return close_now();
  }
  if (ec) return fail(HttpFailure::kBadRequest, request_.path);
  request_.body = std::move(parser_->get().body());
  parser_.reset();
  body_read_ = true;
  dispatch();
}

void Session::dispatch() {
  stream_.expires_never();
  HttpRouter::Route route = std::move(route_);
  route_ = HttpRouter::Route{};
  if (route.inline_ok) {
    InlineConnection conn;
    return respond(route.handler(request_, conn), !keep_alive_);
  }
  run_on_handler_thread(std::move(route));
}

void Session::run_on_handler_thread(HttpRouter::Route route) {
  const uint64_t serial = serial_.load();
  auto task = [self = shared_from_this(), route = std::move(route), request = std::move(request_),
               serial]() mutable {
    Reply reply;
    bool streamed = false, stream_ok = false;
    {
      HandlerConnection conn(self, serial);
      try {
        reply = route.handler(request, conn);
        if (reply.stream && reply.status == 200) {
          streamed = true;
          if (self->write_and_wait(self->head_bytes(200, reply, /*chunked=*/true, !self->keep_alive_))) {
            reply.stream(conn);
            stream_ok = self->write_and_wait("0\r\n\r\n");
          }
        }
      } catch (const std::exception& e) {
        if (!streamed) reply = self->core_.router.internal_error(e.what(), request.path);
      }
    }
    const bool trim = request.body.size() > kTrimAfterBytes;
    request = HttpRequest{};
    if (trim) malloc_trim(0);
    if (streamed) return self->post_stream_end(stream_ok, serial);
    self->post_reply(std::move(reply), serial);
  };
  if (!core_.pool.try_submit(std::move(task))) return fail(HttpFailure::kServerBusy, label_);
  watch_peer(serial);
}

// While a handler runs, the socket is watched: a peer that closes or resets the connection is noticed when
// it happens, not at the next write.
void Session::watch_peer(uint64_t serial) {
  socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(), serial](beast::error_code ec) {
    if (ec || self->serial_.load() != serial || self->closed_) return;
    char byte = 0;
    const ssize_t n = ::recv(self->socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) return;  // a pipelined request: the client is there
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return self->watch_peer(serial);
    self->mark_gone();
  });
}

void Session::mark_gone() {
  if (gone_.exchange(true)) return;
  std::function<void()> cb;
  {
    std::lock_guard lock(gone_mu_);
    cb = std::move(gone_callback_);
    gone_callback_ = nullptr;
  }
  if (cb) cb();
}

void Session::set_gone_callback(uint64_t serial, std::function<void()> f) {
  {
    std::lock_guard lock(gone_mu_);
    if (!f) {
      if (gone_serial_ == serial) gone_callback_ = nullptr;
      return;
    }
    if (!gone_.load()) {
      gone_callback_ = std::move(f);
      gone_serial_ = serial;
      return;
    }
  }
  f();  // already gone
}

bool Session::write_and_wait(std::string bytes) {
  if (gone_.load()) return false;
  auto done = std::make_shared<std::promise<bool>>();
  auto result = done->get_future();
  auto data = std::make_shared<std::string>(std::move(bytes));
  net::post(stream_.get_executor(), [self = shared_from_this(), data, done] {
    self->write(data, [done](bool ok) { done->set_value(ok); });
  });
  try {
    return result.get();
  } catch (const std::future_error&) {
    return false;  // the server stopped before the write ran
  }
}

void Session::post_reply(Reply reply, uint64_t serial) {
  net::post(stream_.get_executor(), [self = shared_from_this(), reply = std::move(reply), serial] {
    if (self->serial_.load() != serial) return;
    if (reply.status == 499 || self->gone_.load()) {
      self->core_.metrics.on_http_response(self->label_, 499);
      return self->close_now();
    }
    self->respond(reply, !self->keep_alive_);
  });
}

void Session::post_stream_end(bool ok, uint64_t serial) {
  net::post(stream_.get_executor(), [self = shared_from_this(), ok, serial] {
    if (self->serial_.load() != serial) return;
    self->after_response(!ok || !self->keep_alive_);
  });
}

std::string Session::head_bytes(int status, const Reply& reply, bool chunked, bool close) const {
  std::string out =
      fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\n", status,
                  std::string_view(http::obsolete_reason(http::int_to_status(static_cast<unsigned>(status)))),
                  reply.content_type);
  out +=
      chunked ? "Transfer-Encoding: chunked\r\n" : fmt::format("Content-Length: {}\r\n", reply.body.size());
  if (close) out += "Connection: close\r\n";
  for (const auto& [k, v] : reply.headers) out += fmt::format("{}: {}\r\n", k, v);
  out += "\r\n";
  // Counted when the status line is about to be written, so a client that holds a response always finds it
  // in /metrics.
  core_.metrics.on_http_response(label_, status);
  return out;
}

void Session::respond(const Reply& reply, bool close) {
  auto bytes = std::make_shared<std::string>(head_bytes(reply.status, reply, false, close));
  bytes->append(reply.body);
  write(bytes, [self = shared_from_this(), close](bool ok) { self->after_response(close || !ok); });
}

void Session::fail(HttpFailure f, std::string_view target_path) {
  const std::string path(target_path);  // it may point into the parser, which goes now
  label_ = HttpRouter::endpoint_label(path);
  keep_alive_ = false;
  const bool trim = parser_ && parser_->get().body().capacity() > kTrimAfterBytes;
  parser_.reset();
  if (trim) malloc_trim(0);
  respond(core_.router.failure(f, path), true);
}

void Session::write(std::shared_ptr<std::string> bytes, std::function<void(bool)> done) {
  if (closed_) return done(false);
  stream_.expires_after(std::chrono::seconds(core_.options.write_timeout_seconds));
  net::async_write(stream_, net::buffer(*bytes),
                   [self = shared_from_this(), bytes, done = std::move(done)](beast::error_code ec, size_t) {
                     self->stream_.expires_never();
                     if (ec) self->mark_gone();
                     done(!ec);
                   });
}

void Session::after_response(bool close) {
  if (closed_) return;
  ++requests_;
  if (!close && !core_.stopping.load()) return read_request();
  // An answer sent before the request was read to its end: drain before closing (see kLinger).
  if (!body_read_ && !gone_.load()) return linger_then_close();
  close_now();
}

void Session::linger_then_close() {
  beast::error_code ignored;
  socket().shutdown(tcp::socket::shutdown_send, ignored);
  stream_.expires_after(kLinger);
  auto sink = std::make_shared<std::array<char, 16384>>();
  struct Drain {
    std::shared_ptr<Session> self;
    std::shared_ptr<std::array<char, 16384>> sink;
    void operator()(beast::error_code ec, size_t) {
      if (ec) return self->close_now();
      self->stream_.async_read_some(net::buffer(*sink), std::move(*this));
    }
  };
  Drain{shared_from_this(), sink}(beast::error_code{}, 0);
}

void Session::close_now() {
  if (closed_) return;
  closed_ = true;
  ++serial_;  // handler results that are still on their way have nobody to go to
  beast::error_code ignored;
  socket().shutdown(tcp::socket::shutdown_both, ignored);
  stream_.close();
}

}  // namespace pd::server::http_detail
