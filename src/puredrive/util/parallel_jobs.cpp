#include "puredrive/util/parallel_jobs.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace pd {

int resolve_thread_count(int requested) {
  return requested > 0 ? requested : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

Status run_parallel_jobs(size_t n, int threads, const std::function<Status(size_t)>& job,
                         const std::function<void()>& tick) {
  std::atomic<size_t> next{0}, done{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::condition_variable cv;
  Status first_error;
  const int nthreads =
      static_cast<int>(std::max<size_t>(1, std::min<size_t>(resolve_thread_count(threads), n)));
  std::vector<std::thread> workers;
  for (int t = 0; t < nthreads && n > 0; ++t) {
    workers.emplace_back([&] {
      while (!failed.load()) {
        const size_t k = next.fetch_add(1);
        if (k >= n) break;
        Status st = job(k);
        if (!st.is_ok()) {
          std::lock_guard<std::mutex> lock(mu);
          if (first_error.is_ok()) first_error = st;
          failed.store(true);
        }
        done.fetch_add(1);
        cv.notify_all();
      }
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    while (done.load() < n && !failed.load()) {
      cv.wait_for(lock, std::chrono::milliseconds(250));
      if (tick) tick();
    }
  }
  for (auto& w : workers) w.join();
  if (tick) tick();
  return first_error;
}

}  // namespace pd
