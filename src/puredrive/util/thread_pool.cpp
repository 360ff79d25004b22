#include "puredrive/util/thread_pool.h"

#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace pd {
namespace {

// How long a thread polls before it blocks: a few decode ops' worth.
constexpr std::chrono::microseconds kSpin{50};

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Polls done() for up to kSpin; true when it became true.
template <typename Done>
bool spin_until(Done done) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (done()) return true;
    cpu_relax();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > until) return false;
  }
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  start_cv_.notify_all();
  for (auto& w : workers_) w.join();
}

static void chunk(size_t n, int parts, int index, size_t* begin, size_t* end) {
  const size_t base = n / static_cast<size_t>(parts);
  const size_t rem = n % static_cast<size_t>(parts);
  const size_t i = static_cast<size_t>(index);
  *begin = i * base + std::min(i, rem);
  *end = *begin + base + (i < rem ? 1 : 0);
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  if (workers_.empty() || n == 1) {
    fn(0, n);
    return;
  }
  job_ = &fn;
  job_n_ = n;
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_cv_.notify_all();
  size_t b, e;
  chunk(n, size(), 0, &b, &e);
  if (b < e) fn(b, e);
  auto done = [this] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!spin_until(done)) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, done);
  }
  job_ = nullptr;
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    auto ready = [&] { return stop_.load() || generation_.load(std::memory_order_acquire) != seen; };
    if (!spin_until(ready)) {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, ready);
    }
    if (stop_.load()) return;
    seen = generation_.load(std::memory_order_acquire);
    size_t b, e;
    chunk(job_n_, size(), index, &b, &e);
    if (b < e) (*job_)(b, e);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // Under the lock: the caller either has not checked yet (and will see 0) or is waiting.
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
  }
}

}  // namespace pd
