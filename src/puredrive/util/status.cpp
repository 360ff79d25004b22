#include "puredrive/util/status.h"

namespace pd {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk:
      return "ok";
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kNotFound:
      return "not found";
    case ErrorCode::kCorrupt:
      return "corrupt";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kOutOfMemory:
      return "out of memory";
    case ErrorCode::kIo:
      return "i/o error";
    case ErrorCode::kInternal:
      return "internal error";
    case ErrorCode::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  return fmt::format("{}: {}", error_code_name(code_), message_);
}

void assert_fail(const char* expr, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "PD_ASSERT failed: %s at %s:%d %s\n", expr, file, line, msg.c_str());
  std::abort();
}

}  // namespace pd
