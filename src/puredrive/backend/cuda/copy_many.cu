// The kernel of copy_many (copy_plan.h): one thread block per piece.
#include <cuda_runtime.h>

#include "puredrive/backend/cuda/copy_plan.h"

namespace pd::cuda {
namespace {

constexpr int kCopyThreads = 256;
constexpr int64_t kMaxCopyBlocks = 65536;  // more pieces: blocks take several, in turn

__global__ void __launch_bounds__(kCopyThreads) copy_pieces_kernel(const CopyPiece* pieces, int64_t count) {
  __shared__ CopyPiece piece;
  for (int64_t i = blockIdx.x; i < count; i += gridDim.x) {
    // The table may be in host memory: read once per block, not once per warp.
    if (threadIdx.x == 0) piece = pieces[i];
    __syncthreads();
    const uint8_t* src = piece.src;
    uint8_t* dst = piece.dst;
    const int64_t n = piece.bytes;
    __syncthreads();   // the next piece's read waits for every thread to have this one
    int64_t head = n;  // bytes copied one at a time before the 16-byte part
    int64_t words = 0;
    if (((reinterpret_cast<uintptr_t>(src) ^ reinterpret_cast<uintptr_t>(dst)) & 15) == 0) {
      head = min(n, static_cast<int64_t>((16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15));
      words = (n - head) / 16;
    }
    const int64_t tail = head + words * 16;
    for (int64_t j = threadIdx.x; j < head; j += kCopyThreads) dst[j] = src[j];
    const uint4* s16 = reinterpret_cast<const uint4*>(src + head);
    uint4* d16 = reinterpret_cast<uint4*>(dst + head);
    for (int64_t j = threadIdx.x; j < words; j += kCopyThreads) d16[j] = s16[j];
    for (int64_t j = tail + threadIdx.x; j < n; j += kCopyThreads) dst[j] = src[j];
  }
}

}  // namespace

void launch_copy_pieces(const CopyPiece* pieces, int64_t count, CUstream_st* stream) {
  const auto blocks = static_cast<unsigned>(count < kMaxCopyBlocks ? count : kMaxCopyBlocks);
  copy_pieces_kernel<<<blocks, kCopyThreads, 0, stream>>>(pieces, count);
}

}  // namespace pd::cuda
