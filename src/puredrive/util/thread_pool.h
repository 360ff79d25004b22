// A fixed-size pool with a static partition of work. parallel_for(n, fn) calls fn(i) once for every i in
// [0, n); each index's work must be self-contained so that results never depend on the thread count.
// Between jobs a worker spins for a few tens of microseconds before it sleeps on the condition variable,
// and the caller likewise waits for the last chunk: a decode step is hundreds of jobs of 10-100 us each,
// where a futex wake-up per job cost a third of the CPU time (tiny coder, 2 threads).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace pd {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);  // num_threads <= 0: hardware concurrency
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Splits [0, n) into size() contiguous chunks; the calling thread takes chunk 0.
  void parallel_for(size_t n, const std::function<void(size_t begin, size_t end)>& fn);

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  // The job is written before generation_ is raised (under mu_, so a worker about to sleep sees it) and
  // read after a worker sees the new generation.
  const std::function<void(size_t, size_t)>* job_ = nullptr;
  size_t job_n_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace pd
