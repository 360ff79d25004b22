#include "puredrive/backend/cuda/weight_upload.h"

#include <vector>

#include <fmt/format.h>

#include "puredrive/backend/cuda/kernels.h"

namespace pd::cuda {
namespace {

constexpr size_t kChunkBytes = 16u << 20;

// Reader threads: 4, or PD_UPLOAD_THREADS (1..64) for machines whose file reads need more in flight.
int reader_threads() {
  const int n = env_int("PD_UPLOAD_THREADS", 0);
  return n >= 1 && n <= 64 ? n : 4;
}

Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::ok();
  return make_error(ErrorCode::kInternal, "CUDA: {} failed during a weight upload: {} ({})", what,
                    cudaGetErrorString(e), cudaGetErrorName(e));
}

}  // namespace

// Two pinned buffers and their "copied" events per worker. The workers call in from their own threads, so
// each selects the backend's device first (the runtime's current device is per thread).
class WeightUploader::Staging final : public StagingTarget {
 public:
  Staging(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  ~Staging() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    for (uint8_t* p : buffers_) cudaFreeHost(p);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }

  Status init(int workers, size_t chunk_bytes) {
    PD_TRY(cuda_status(cudaSetDevice(device_), "cudaSetDevice"));
    for (int i = 0; i < workers * StagedCopier::kSlots; ++i) {
      void* p = nullptr;
      PD_TRY(cuda_status(cudaHostAlloc(&p, chunk_bytes, cudaHostAllocDefault), "cudaHostAlloc"));
      buffers_.push_back(static_cast<uint8_t*>(p));
      cudaEvent_t e = nullptr;
      PD_TRY(cuda_status(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate"));
      events_.push_back(e);
    }
    used_.assign(buffers_.size(), 0);
    return Status::ok();
  }

  uint8_t* buffer(int worker, int slot) override { return buffers_[index(worker, slot)]; }

  Status wait(int worker, int slot) override {
    const size_t i = index(worker, slot);
    if (used_[i] == 0) return Status::ok();
    PD_TRY(cuda_status(cudaSetDevice(device_), "cudaSetDevice"));
    return cuda_status(cudaEventSynchronize(events_[i]), "cudaEventSynchronize");
  }

  Status submit(int worker, int slot, void* dst, size_t n) override {
    const size_t i = index(worker, slot);
    PD_TRY(cuda_status(cudaSetDevice(device_), "cudaSetDevice"));
    PD_TRY(cuda_status(cudaMemcpyAsync(dst, buffers_[i], n, cudaMemcpyHostToDevice, stream_),
                       "cudaMemcpyAsync"));
    used_[i] = 1;
    return cuda_status(cudaEventRecord(events_[i], stream_), "cudaEventRecord");
  }

  Status finish() override {
    PD_TRY(cuda_status(cudaSetDevice(device_), "cudaSetDevice"));
    return cuda_status(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

 private:
  static size_t index(int worker, int slot) {
    return static_cast<size_t>(worker * StagedCopier::kSlots + slot);
  }
  int device_;
  cudaStream_t stream_;
  std::vector<uint8_t*> buffers_;
  std::vector<cudaEvent_t> events_;
  std::vector<char> used_;  // a buffer's event has been recorded at least once
};

WeightUploader::WeightUploader(int device, cudaStream_t stream) : device_(device), stream_(stream) {}

WeightUploader::~WeightUploader() {
  release();
}

Status WeightUploader::copy(std::span<const CopyRange> ranges) {
  if (ranges.empty()) return Status::ok();  // synthetic weights, generated on the device
  if (!copier_) {
    auto copier = std::make_unique<StagedCopier>(reader_threads(), kChunkBytes);
    auto staging = std::make_unique<Staging>(device_, stream_);
    PD_TRY(staging->init(copier->workers(), copier->chunk_bytes()));
    copier_ = std::move(copier);
    staging_ = std::move(staging);
  }
  return copier_->copy(ranges, *staging_);
}

void WeightUploader::release() {
  staging_.reset();
  copier_.reset();
}

}  // namespace pd::cuda
