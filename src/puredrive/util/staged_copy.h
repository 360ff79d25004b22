// Copies of large host ranges (weights in memory-mapped checkpoints) to a target such as a GPU, through
// fixed staging buffers, with reading overlapped with the target's transfer: every worker thread owns two
// buffers; while the target moves one (asynchronously), the thread reads the next chunk into the other.
// Reads use read_weight_bytes() (pread for mapped files), so host memory stays at the staging buffers
// however large the model. The target is an interface so that the pipeline is tested without a GPU.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "puredrive/util/mapped_file.h"
#include "puredrive/util/status.h"
#include "puredrive/util/thread_pool.h"

namespace pd {

struct CopyRange {
  void* dst = nullptr;  // target address (device memory for the CUDA backend)
  const void* src = nullptr;
  size_t bytes = 0;
};

// Where staged chunks go. buffer(w, s) is staging buffer s (0 or 1) of worker w, chunk_bytes long;
// submit() starts moving its first n bytes to dst and may return before that is done; wait() returns once the
// buffer's last submission is complete (so it may be refilled); finish() once every submission is.
class StagingTarget {
 public:
  virtual ~StagingTarget() = default;
  virtual uint8_t* buffer(int worker, int slot) = 0;
  virtual Status wait(int worker, int slot) = 0;
  virtual Status submit(int worker, int slot, void* dst, size_t n) = 0;
  virtual Status finish() = 0;
};

class StagedCopier {
 public:
  static constexpr int kSlots = 2;

  // workers <= 0: 4 (enough to read the page cache at several GB/s; more only contend for memory bandwidth).
  StagedCopier(int workers, size_t chunk_bytes, WeightRead read = default_weight_read());
  int workers() const { return pool_.size(); }
  size_t chunk_bytes() const { return chunk_bytes_; }

  // Copies every range and returns when all bytes have reached the target (or on the first error). Safe to
  // call from one thread at a time.
  Status copy(std::span<const CopyRange> ranges, StagingTarget& target);

  // Bytes read and submitted so far, over all copy() calls (for progress reports from other threads).
  uint64_t bytes_copied() const { return copied_.load(std::memory_order_relaxed); }

 private:
  ThreadPool pool_;
  size_t chunk_bytes_;
  WeightRead read_;
  std::atomic<uint64_t> copied_{0};
};

}  // namespace pd
