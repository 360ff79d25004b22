#include "puredrive/util/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
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

}  // namespace
}  // namespace pd
