#include "puredrive/util/log.h"

#include <gtest/gtest.h>

namespace pd {
namespace {

std::chrono::system_clock::time_point at_ms(int64_t ms) {
  return std::chrono::system_clock::time_point(std::chrono::milliseconds(ms));
}

// Expected strings computed with Python's datetime, independently of this code.
TEST(LogTimestamp, IsIso8601UtcWithMilliseconds) {
  EXPECT_EQ(log_timestamp(at_ms(0)), "1970-01-01T00:00:00.000Z");
  EXPECT_EQ(log_timestamp(at_ms(1796137445123)), "2026-12-01T15:04:05.123Z");
  EXPECT_EQ(log_timestamp(at_ms(951868799999)), "2000-02-29T23:59:59.999Z");
}

TEST(LogTimestamp, TruncatesBelowTheMillisecond) {
  const auto t = at_ms(1796137445123) + std::chrono::microseconds(999);
  EXPECT_EQ(log_timestamp(t), "2026-12-01T15:04:05.123Z");
}

TEST(LogTimestamp, BeforeTheEpochCountsBackwards) {
  EXPECT_EQ(log_timestamp(at_ms(-1)), "1969-12-31T23:59:59.999Z");
}

}  // namespace
}  // namespace pd
