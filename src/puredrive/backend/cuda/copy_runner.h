// copy_many's runs on the GPU (copy_plan.h): each round's piece table and staged host bytes go into one of a
// few mapped pinned buffers, then one launch copies the round. A buffer is reused once the launch that read
// it has run, so that a copy queued behind device work (the prefix cache stores after every prefill chunk)
// does not make the host wait for that work; with every buffer still in use, the host waits for the oldest.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <vector>

#include "puredrive/backend/cuda/copy_plan.h"
#include "puredrive/util/status.h"

namespace pd::cuda {

class CopyRunner {
 public:
  explicit CopyRunner(cudaStream_t stream) : stream_(stream) {}
  ~CopyRunner();
  CopyRunner(const CopyRunner&) = delete;
  CopyRunner& operator=(const CopyRunner&) = delete;

  // Queues the spans (none host to host) on the stream and returns when host destinations hold their bytes;
  // host_waits counts each time the host waited for the device.
  Status run(const std::vector<CopySpan>& spans, int64_t& host_waits);

 private:
  struct Slot {
    uint8_t* host = nullptr;
    uint8_t* device = nullptr;  // the same memory as the device sees it
    int64_t bytes = 0;
    cudaEvent_t done = nullptr;  // recorded after the launch that reads the slot
    uint64_t last_run = 0;
  };
  Expected<Slot*> slot(int64_t bytes, int64_t& host_waits);
  Status grow(Slot& s, int64_t bytes);

  cudaStream_t stream_;
  std::array<Slot, 4> slots_{};
  uint64_t runs_ = 0;
};

}  // namespace pd::cuda
