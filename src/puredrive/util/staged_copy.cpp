#include "puredrive/util/staged_copy.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include "puredrive/util/mapped_file.h"

namespace pd {
namespace {

struct Chunk {
  uint8_t* dst;
  const uint8_t* src;
  size_t bytes;
};

}  // namespace

StagedCopier::StagedCopier(int workers, size_t chunk_bytes, WeightRead read)
    : pool_(workers > 0 ? workers : 4), chunk_bytes_(std::max<size_t>(chunk_bytes, 4096)), read_(read) {}

Status StagedCopier::copy(std::span<const CopyRange> ranges, StagingTarget& target) {
  std::vector<Chunk> chunks;
  for (const CopyRange& r : ranges) {
    for (size_t off = 0; off < r.bytes; off += chunk_bytes_) {
      chunks.push_back({static_cast<uint8_t*>(r.dst) + off, static_cast<const uint8_t*>(r.src) + off,
                        std::min(chunk_bytes_, r.bytes - off)});
    }
  }
  if (chunks.empty()) return Status::ok();
  // Workers take whole chunks in a fixed partition; each alternates between its two buffers, so the read of
  // one chunk overlaps the transfer of the previous one.
  std::mutex mu;
  Status first_error;
  std::atomic<bool> failed{false};
  const int n_workers = workers();
  pool_.parallel_for(static_cast<size_t>(n_workers), [&](size_t begin, size_t end) {
    for (size_t w = begin; w < end; ++w) {
      int slot = 0;
      for (size_t c = w; c < chunks.size() && !failed.load(); c += static_cast<size_t>(n_workers)) {
        const Chunk& ch = chunks[c];
        const int wi = static_cast<int>(w);
        Status st = target.wait(wi, slot);
        if (st.is_ok()) st = read_weight_bytes(target.buffer(wi, slot), ch.src, ch.bytes, read_);
        if (st.is_ok()) st = target.submit(wi, slot, ch.dst, ch.bytes);
        if (!st.is_ok()) {
          std::lock_guard<std::mutex> lock(mu);
          if (first_error.is_ok()) first_error = st;
          failed.store(true);
          break;
        }
        copied_.fetch_add(ch.bytes, std::memory_order_relaxed);
        slot = (slot + 1) % kSlots;
      }
    }
  });
  Status done = target.finish();
  if (!first_error.is_ok()) return first_error;
  return done;
}

}  // namespace pd
