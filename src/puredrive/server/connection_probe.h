// Tells whether the client of an HTTP request has closed its connection, without reading from it.
// cpp-httplib 0.11 gives handlers no access to the socket and only notices a dead peer when a write fails,
// so a request waiting for the engine (non-streaming, or streaming before its first token) could keep the
// engine busy for a client that is gone. The probe finds the connection's socket among the process's file
// descriptors by its two endpoints (Linux /proc/self/fd) and peeks at it: a peer that closed or reset the
// connection reads as end-of-file or an error. The socket stays open while the handler runs, so the
// descriptor cannot be reused under the probe.
//
// Limitation: a client that half-closes (shutdown(SHUT_WR)) after sending its request looks gone.
#pragma once

#include <string>

namespace pd::server {

class ConnectionProbe {
 public:
  ConnectionProbe() = default;
  static ConnectionProbe find(const std::string& local_addr, int local_port, const std::string& remote_addr,
                              int remote_port);
  bool found() const { return fd_ >= 0; }
  // True when the peer closed or reset the connection; false when it is open or the socket is unknown.
  bool peer_closed() const;

 private:
  int fd_ = -1;
};

}  // namespace pd::server
