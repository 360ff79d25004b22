#include "puredrive/util/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace pd {
namespace {

TEST(ThreadPool, VisitsEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 4, 7}) {
    ThreadPool pool(threads);
    for (size_t n : {0u, 1u, 3u, 100u, 1001u}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(n, [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) hits[i]++;
      });
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "threads=" << threads << " n=" << n;
    }
  }
}

// Back-to-back jobs (workers still polling) and jobs after a pause (workers asleep on the condition
// variable): every job runs completely before parallel_for returns, whichever way a worker was woken.
TEST(ThreadPool, JobsBackToBackAndAfterSleeping) {
  for (int threads : {2, 3, 8}) {
    ThreadPool pool(threads);
    std::vector<int> sums(64, 0);
    for (int job = 0; job < 3000; ++job) {
      if (job % 500 == 499) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      const size_t n = static_cast<size_t>(1 + job % 17);
      pool.parallel_for(n, [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) sums[i] += 1;
      });
    }
    // Index i ran in every job whose n exceeded i.
    for (size_t i = 0; i < 17; ++i) {
      int expected = 0;
      for (int job = 0; job < 3000; ++job) expected += static_cast<size_t>(1 + job % 17) > i ? 1 : 0;
      ASSERT_EQ(sums[i], expected) << "threads=" << threads << " i=" << i;
    }
  }
}

}  // namespace
}  // namespace pd
