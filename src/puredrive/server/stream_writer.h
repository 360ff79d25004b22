// SSE output of one streaming response: remembers when it last wrote (for keep-alives) and that the client
// is gone after the first failed write.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "puredrive/server/api_service.h"
#include "puredrive/server/openai_format.h"

namespace pd::server {

class StreamWriter {
 public:
  // keepalive: what is sent while nothing else is (an SSE comment for OpenAI streams, a ping event for
  // Anthropic's).
  explicit StreamWriter(ClientConnection& client, std::string keepalive = sse_comment("keep-alive"))
      : client_(client), keepalive_(std::move(keepalive)), last_write_(std::chrono::steady_clock::now()) {}

  bool data(const Json& j) { return raw(sse_data(j)); }
  bool raw(std::string_view bytes) {
    if (failed_) return false;
    failed_ = !client_.write(bytes);
    last_write_ = std::chrono::steady_clock::now();
    return !failed_;
  }
  bool keepalive() { return raw(keepalive_); }
  bool failed() const { return failed_; }
  std::chrono::steady_clock::duration since_last_write() const {
    return std::chrono::steady_clock::now() - last_write_;
  }
  ClientConnection& client() { return client_; }

 private:
  ClientConnection& client_;
  std::string keepalive_;
  std::chrono::steady_clock::time_point last_write_;
  bool failed_ = false;
};

}  // namespace pd::server
