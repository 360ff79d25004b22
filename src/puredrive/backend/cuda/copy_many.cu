// The kernel of copy_many (copy_plan.h), one thread block per piece, and the kernels of a step's copies,
// uploads and zero fills.
#include <cuda_runtime.h>

#include <algorithm>

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

// Rows of n vectors V; src null: zeros. Blocks stride over a row's vectors (x) and over the rows (y).
template <typename V>
__global__ void __launch_bounds__(kCopyThreads)
    copy_rows_kernel(uint8_t* dst, int64_t dst_pitch, const uint8_t* src, int64_t src_pitch, int64_t n,
                     int64_t rows) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    V* d = reinterpret_cast<V*>(dst + r * dst_pitch);
    const V* s = src == nullptr ? nullptr : reinterpret_cast<const V*>(src + r * src_pitch);
    for (int64_t j = blockIdx.x * int64_t{kCopyThreads} + threadIdx.x; j < n;
         j += int64_t{gridDim.x} * kCopyThreads) {
      d[j] = s == nullptr ? V{} : s[j];
    }
  }
}

template <typename V>
void launch_rows(uint8_t* dst, int64_t dst_pitch, const uint8_t* src, int64_t src_pitch, int64_t width,
                 int64_t rows, CUstream_st* stream) {
  const int64_t n = width / static_cast<int64_t>(sizeof(V));
  // About 16 blocks of 256 threads per SM of a 132-SM GPU for large copies; one block for a small row.
  const int64_t x = std::clamp<int64_t>((n + kCopyThreads - 1) / kCopyThreads, 1, 2048);
  const int64_t y = std::clamp<int64_t>(2048 / x, 1, std::min<int64_t>(rows, 65535));
  copy_rows_kernel<V><<<dim3(static_cast<unsigned>(x), static_cast<unsigned>(y)), kCopyThreads, 0, stream>>>(
      dst, dst_pitch, src, src_pitch, n, rows);
}

void copy_or_zero_rows(uint8_t* dst, int64_t dst_pitch, const uint8_t* src, int64_t src_pitch, int64_t width,
                       int64_t rows, CUstream_st* stream) {
  if (width <= 0 || rows <= 0) return;
  // The widest vector that every row start and the width allow.
  uint64_t bits = reinterpret_cast<uintptr_t>(dst) | static_cast<uint64_t>(width) |
                  static_cast<uint64_t>(rows > 1 ? dst_pitch : 0);
  if (src != nullptr)
    bits |= reinterpret_cast<uintptr_t>(src) | static_cast<uint64_t>(rows > 1 ? src_pitch : 0);
  if ((bits & 15) == 0) {
    launch_rows<uint4>(dst, dst_pitch, src, src_pitch, width, rows, stream);
  } else if ((bits & 7) == 0) {
    launch_rows<uint2>(dst, dst_pitch, src, src_pitch, width, rows, stream);
  } else if ((bits & 3) == 0) {
    launch_rows<uint32_t>(dst, dst_pitch, src, src_pitch, width, rows, stream);
  } else {
    launch_rows<uint8_t>(dst, dst_pitch, src, src_pitch, width, rows, stream);
  }
}

}  // namespace

void launch_copy_rows(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t width,
                      int64_t rows, CUstream_st* stream) {
  copy_or_zero_rows(static_cast<uint8_t*>(dst), dst_pitch, static_cast<const uint8_t*>(src), src_pitch, width,
                    rows, stream);
}

void launch_zero_rows(void* dst, int64_t pitch, int64_t width, int64_t rows, CUstream_st* stream) {
  copy_or_zero_rows(static_cast<uint8_t*>(dst), pitch, nullptr, 0, width, rows, stream);
}

void launch_copy_pieces(const CopyPiece* pieces, int64_t count, CUstream_st* stream) {
  const auto blocks = static_cast<unsigned>(count < kMaxCopyBlocks ? count : kMaxCopyBlocks);
  copy_pieces_kernel<<<blocks, kCopyThreads, 0, stream>>>(pieces, count);
}

}  // namespace pd::cuda
