// TEST ONLY: a raw HTTP/1.1 client over one TCP connection, for the server's in-process tests. It sends
// exactly the bytes it is given and can read part of a reply, stall, or hang up, which a real client
// library would not do. Optionally binds a source address first (127.0.0.x), to act as another client.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace pd::server::testing {

struct HttpReply {
  int status = 0;  // 0: no complete status line arrived
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;

  std::string header(const std::string& name) const {
    for (const auto& [k, v] : headers) {
      if (k.size() == name.size() && strncasecmp(k.c_str(), name.c_str(), k.size()) == 0) return v;
    }
    return "";
  }
};

class RawConnection {
 public:
  explicit RawConnection(int port, const char* source = nullptr, int recv_timeout_seconds = 10) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    if (source) {
      sockaddr_in src{};
      src.sin_family = AF_INET;
      inet_pton(AF_INET, source, &src.sin_addr);
      if (::bind(fd_, reinterpret_cast<sockaddr*>(&src), sizeof(src)) != 0) return;
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    timeval tv{.tv_sec = recv_timeout_seconds, .tv_usec = 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~RawConnection() { close(); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool connected() const { return connected_; }
  int fd() const { return fd_; }

  bool send(const std::string& bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }
  bool send_request(const std::string& method, const std::string& path, const std::string& body = "",
                    const std::string& extra_headers = "") {
    std::string req = method + " " + path + " HTTP/1.1\r\nHost: x\r\n" + extra_headers;
    if (!body.empty() || method == "POST") {
      req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    }
    return send(req + "\r\n" + body);
  }
  // Reads until `needle` was seen (true) or the connection closed / timed out (false).
  bool read_until(const std::string& needle) {
    while (received_.find(needle) == std::string::npos) {
      if (!read_some()) return false;
    }
    return true;
  }
  // Reads one whole response (Content-Length or chunked body); status 0 when it did not arrive.
  HttpReply read_reply() {
    HttpReply r;
    if (!read_until("\r\n\r\n")) return r;
    const size_t head_end = received_.find("\r\n\r\n");
    const std::string head = received_.substr(0, head_end);
    size_t pos = head.find("\r\n");
    const std::string status_line = head.substr(0, pos);
    if (status_line.rfind("HTTP/1.1 ", 0) != 0) return r;
    bool chunked = false;
    std::optional<size_t> length;
    while (pos != std::string::npos && pos < head.size()) {
      const size_t next = head.find("\r\n", pos + 2);
      const std::string line =
          head.substr(pos + 2, next == std::string::npos ? std::string::npos : next - pos - 2);
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string value = line.substr(colon + 1);
        while (!value.empty() && value[0] == ' ') value.erase(0, 1);
        r.headers.emplace_back(line.substr(0, colon), value);
      }
      pos = next;
    }
    if (r.header("Transfer-Encoding") == "chunked") chunked = true;
    if (!r.header("Content-Length").empty()) length = std::stoul(r.header("Content-Length"));
    std::string rest = received_.substr(head_end + 4);
    if (chunked) {
      while (rest.find("0\r\n\r\n") == std::string::npos || !dechunk(rest, &r.body)) {
        if (!read_some()) return r;
        rest = received_.substr(head_end + 4);
      }
    } else {
      while (length && rest.size() < *length) {
        if (!read_some()) return r;
        rest = received_.substr(head_end + 4);
      }
      r.body = length ? rest.substr(0, *length) : rest;
    }
    r.status = std::stoi(status_line.substr(9, 3));
    return r;
  }
  // True when the server closed the connection (end of file or reset) within the receive timeout.
  bool closed_by_peer() {
    while (read_some()) {
    }
    return last_read_ == 0 || (last_read_ < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
  }
  const std::string& received() const { return received_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  bool read_some() {
    char buf[16384];
    last_read_ = recv(fd_, buf, sizeof(buf), 0);
    if (last_read_ <= 0) return false;
    received_.append(buf, static_cast<size_t>(last_read_));
    return true;
  }
  static bool dechunk(const std::string& in, std::string* out) {
    out->clear();
    size_t pos = 0;
    for (;;) {
      const size_t eol = in.find("\r\n", pos);
      if (eol == std::string::npos) return false;
      const size_t n = std::stoul(in.substr(pos, eol - pos), nullptr, 16);
      if (n == 0) return true;
      if (eol + 2 + n + 2 > in.size()) return false;
      out->append(in, eol + 2, n);
      pos = eol + 2 + n + 2;
    }
  }

  int fd_ = -1;
  bool connected_ = false;
  ssize_t last_read_ = 1;
  std::string received_;
};

// One request on a fresh connection.
inline HttpReply http_request(int port, const std::string& method, const std::string& path,
                              const std::string& body = "", const std::string& extra_headers = "") {
  RawConnection c(port);
  if (!c.connected() || !c.send_request(method, path, body, extra_headers)) return HttpReply{};
  return c.read_reply();
}

}  // namespace pd::server::testing
