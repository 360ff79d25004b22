#include "puredrive/util/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace pd {
namespace {

LogLevel level_from_env() {
  const char* v = std::getenv("PD_LOG_LEVEL");
  if (v == nullptr) return LogLevel::kInfo;
  if (std::strcmp(v, "debug") == 0) return LogLevel::kDebug;
  if (std::strcmp(v, "warn") == 0) return LogLevel::kWarn;
  if (std::strcmp(v, "error") == 0) return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<LogLevel>& level_ref() {
  static std::atomic<LogLevel> level{level_from_env()};
  return level;
}

}  // namespace

LogLevel log_level() { return level_ref().load(std::memory_order_relaxed); }
void set_log_level(LogLevel level) { level_ref().store(level); }

void log_line(LogLevel level, const std::string& message) {
  static std::mutex mu;
  static const char* names[] = {"D", "I", "W", "E"};
  const auto now = std::chrono::system_clock::now();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "%s %lld.%03lld %s\n", names[static_cast<int>(level)], static_cast<long long>(ms / 1000),
               static_cast<long long>(ms % 1000), message.c_str());
}

}  // namespace pd
