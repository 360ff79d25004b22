#include "puredrive/server/connection_probe.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

namespace pd::server {
namespace {

bool endpoint_is(const sockaddr_storage& addr, const std::string& host, int port) {
  char text[INET6_ADDRSTRLEN] = {};
  int p = -1;
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    p = ntohs(in->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    p = ntohs(in6->sin6_port);
  } else {
    return false;
  }
  return p == port && host == text;
}

}  // namespace

ConnectionProbe ConnectionProbe::find(const std::string& local_addr, int local_port,
                                      const std::string& remote_addr, int remote_port) {
  ConnectionProbe probe;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return probe;
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat st {};
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t local_len = sizeof(local), peer_len = sizeof(peer);
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &local_len) != 0) continue;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) continue;
    if (endpoint_is(local, local_addr, local_port) && endpoint_is(peer, remote_addr, remote_port)) {
      probe.fd_ = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return probe;
}

bool ConnectionProbe::peer_closed() const {
  if (fd_ < 0) return false;
  char byte = 0;
  const ssize_t n = recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return false;  // data waiting (a pipelined request): still there
  if (n == 0) return true;  // orderly close
  return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

}  // namespace pd::server
