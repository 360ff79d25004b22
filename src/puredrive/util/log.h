// Minimal leveled logging to stderr, one line per message: level letter, UTC time (ISO 8601, milliseconds),
// message, e.g. "I 2026-12-01T15:04:05.123Z serving ...". Level from PD_LOG_LEVEL (debug|info|warn|error),
// default info.
#pragma once

#include <chrono>
#include <string>

#include <fmt/format.h>

namespace pd {

enum class LogLevel { kDebug, kInfo, kWarn, kError };

LogLevel log_level();
void set_log_level(LogLevel level);
void log_line(LogLevel level, const std::string& message);
// "YYYY-MM-DDTHH:MM:SS.mmmZ" (UTC, truncated to the millisecond).
std::string log_timestamp(std::chrono::system_clock::time_point t);

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> f, Args&&... args) {
  if (level < log_level()) return;
  log_line(level, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace pd

#define PD_LOG_DEBUG(...) ::pd::log(::pd::LogLevel::kDebug, __VA_ARGS__)
#define PD_LOG_INFO(...) ::pd::log(::pd::LogLevel::kInfo, __VA_ARGS__)
#define PD_LOG_WARN(...) ::pd::log(::pd::LogLevel::kWarn, __VA_ARGS__)
#define PD_LOG_ERROR(...) ::pd::log(::pd::LogLevel::kError, __VA_ARGS__)
