// Weight uploads of the CUDA backend: host ranges (mostly inside memory-mapped checkpoints) to device memory
// through pinned staging buffers, with reader threads filling one buffer by pread() while the copy engine
// moves the previous one (util/staged_copy.h). The host never maps the checkpoint's pages, so its resident
// memory stays at the staging buffers (2 x 16 MiB per reader thread; 4 threads, or PD_UPLOAD_THREADS)
// whatever the model size. PD_WEIGHT_READ=mmap reads through the mapping instead (util/mapped_file.h).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <span>

#include "puredrive/util/staged_copy.h"
#include "puredrive/util/status.h"

namespace pd::cuda {

class WeightUploader {
 public:
  WeightUploader(int device, cudaStream_t stream);
  ~WeightUploader();
  WeightUploader(const WeightUploader&) = delete;
  WeightUploader& operator=(const WeightUploader&) = delete;

  // Copies every range and returns when the bytes are in device memory. Threads and pinned buffers are made
  // at the first call and kept until release().
  Status copy(std::span<const CopyRange> ranges);
  // Frees the reader threads and the pinned buffers (weights are bound once, before the first step).
  void release();

 private:
  class Staging;
  int device_;
  cudaStream_t stream_;
  std::unique_ptr<StagedCopier> copier_;
  std::unique_ptr<Staging> staging_;
};

}  // namespace pd::cuda
