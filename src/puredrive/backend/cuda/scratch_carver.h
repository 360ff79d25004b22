// Lays out an op's scratch buffer as consecutive parts, each 256-byte aligned. With a null base every part
// is null and only the size is measured, so one function both sizes a scratch (host) and carves it (host or
// device) and the two cannot disagree.
#pragma once

#include <cstdint>

#ifndef PD_HOST_DEVICE
#ifdef __CUDACC__
#define PD_HOST_DEVICE __host__ __device__
#else
#define PD_HOST_DEVICE
#endif
#endif

namespace pd::cuda {

class ScratchCarver {
 public:
  PD_HOST_DEVICE explicit ScratchCarver(void* base) : base_(static_cast<uint8_t*>(base)) {}

  // The next part: `count` elements of T.
  template <typename T>
  PD_HOST_DEVICE T* take(int64_t count) {
    T* part = base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + used_);
    used_ += (count * static_cast<int64_t>(sizeof(T)) + 255) / 256 * 256;
    return part;
  }

  // Bytes of the parts taken so far.
  PD_HOST_DEVICE int64_t bytes() const { return used_; }

 private:
  uint8_t* base_;
  int64_t used_ = 0;
};

}  // namespace pd::cuda
