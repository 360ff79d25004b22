#include "puredrive/util/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
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

LogLevel log_level() {
  return level_ref().load(std::memory_order_relaxed);
}
void set_log_level(LogLevel level) {
  level_ref().store(level);
}

std::string log_timestamp(std::chrono::system_clock::time_point t) {
  const auto whole = std::chrono::floor<std::chrono::seconds>(t);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - whole).count();
  const std::time_t secs = std::chrono::system_clock::to_time_t(whole);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
}

void log_line(LogLevel level, const std::string& message) {
  static std::mutex mu;
  static const char* names[] = {"D", "I", "W", "E"};
  const std::string when = log_timestamp(std::chrono::system_clock::now());
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "%s %s %s\n", names[static_cast<int>(level)], when.c_str(), message.c_str());
}

}  // namespace pd
