// Device helpers shared by the kernels: weight decoding (8 columns at a time), the row-exact dot product of
// one warp, fixed-order block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "puredrive/backend/cuda/kernels.h"

namespace pd::cuda {

__device__ __forceinline__ float bf16_bits(uint32_t h) {
  return __uint_as_float(h << 16);
}
__device__ __forceinline__ float f16_bits(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
}
__device__ __forceinline__ uint16_t to_bf16_bits(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

__device__ __forceinline__ float sigmoidf_(float x) {
  return 1.0f / (1.0f + expf(-x));
}
__device__ __forceinline__ float siluf_(float x) {
  return x / (1.0f + expf(-x));
}
__device__ __forceinline__ float softplusf_(float x) {
  return x > 20.0f ? x : log1pf(expf(x));
}

__device__ __forceinline__ float scale_at(const void* p, SDType t, int64_t i) {
  switch (t) {
    case SDType::kBF16:
      return bf16_bits(static_cast<const uint16_t*>(p)[i]);
    case SDType::kF16:
      return f16_bits(static_cast<const uint16_t*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

// Weight formats as template parameters: FMT is a WFmt value, BITS the affine width (0 for dense).
template <int FMT, int BITS>
struct Fmt {};

// Columns [8c, 8c + 8) of row n of m (data/scales/biases already offset to the expert) as f32.
// MLX affine: codes are LSB-first in the row's bit stream, so 8 codes start at byte c * BITS;
// w = scale * q + bias with two roundings (no fused multiply-add), as the CPU backend computes it.
template <int FMT, int BITS>
__device__ __forceinline__ void load_w8(const DevMatrix& m, const void* data, const void* scales,
                                        const void* biases, int64_t n, int64_t c, float w[8]) {
  if constexpr (FMT == static_cast<int>(WFmt::kF32)) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(data) + n * m.cols + c * 8);
    const float4 a = __ldg(p), b = __ldg(p + 1);
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
  } else if constexpr (FMT == static_cast<int>(WFmt::kBF16) || FMT == static_cast<int>(WFmt::kF16)) {
    const uint4 q =
        __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(data) + n * m.cols + c * 8));
    const uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (FMT == static_cast<int>(WFmt::kBF16)) {
        w[2 * i] = bf16_bits(u[i] & 0xffffu);
        w[2 * i + 1] = bf16_bits(u[i] >> 16);
      } else {
        w[2 * i] = f16_bits(u[i] & 0xffffu);
        w[2 * i + 1] = f16_bits(u[i] >> 16);
      }
    }
  } else {
    const int64_t row_bytes = m.cols * BITS / 8;
    const uint8_t* p = static_cast<const uint8_t*>(data) + n * row_bytes + c * BITS;
    uint64_t v;
    if constexpr (BITS == 8) {
      const uint2 q = __ldg(reinterpret_cast<const uint2*>(p));
      v = static_cast<uint64_t>(q.x) | (static_cast<uint64_t>(q.y) << 32);
    } else if constexpr (BITS == 4) {
      v = __ldg(reinterpret_cast<const uint32_t*>(p));
    } else if constexpr (BITS == 2) {
      v = __ldg(reinterpret_cast<const uint16_t*>(p));
    } else if constexpr (BITS == 6) {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
      v = static_cast<uint64_t>(__ldg(h)) | (static_cast<uint64_t>(__ldg(h + 1)) << 16) |
          (static_cast<uint64_t>(__ldg(h + 2)) << 32);
    } else {
      v = 0;
#pragma unroll
      for (int i = 0; i < BITS; ++i) v |= static_cast<uint64_t>(__ldg(p + i)) << (8 * i);
    }
    const int64_t groups = m.cols / m.group_size;
    const int64_t gi = n * groups + (c * 8) / m.group_size;
    const float scale = scale_at(scales, m.scale_dtype, gi);
    const float bias = scale_at(biases, m.scale_dtype, gi);
    constexpr uint64_t kMask = (1ull << BITS) - 1ull;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float product = scale * static_cast<float>(static_cast<uint32_t>((v >> (BITS * j)) & kMask));
      w[j] = product + bias;
    }
  }
}

// 8 consecutive floats of an activation row (16-byte aligned when VEC).
template <bool VEC>
__device__ __forceinline__ void load_x8(const float* p, float x[8]) {
  if constexpr (VEC) {
    const float4 a = *reinterpret_cast<const float4*>(p);
    const float4 b = *reinterpret_cast<const float4*>(p + 4);
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) x[j] = p[j];
  }
}

// Lane l of the warp that owns output n accumulates, for every row r in mask, the columns of its chunks
// c = l, l + 32, ... (8 columns each, in order) of the dot product of weight row n with xr[r]. A row's
// partial sums never depend on the other rows, so the result is the same for any R or mask.
template <int FMT, int BITS, bool VEC>
__device__ __forceinline__ void dot_rows(const DevMatrix& m, const void* data, const void* scales,
                                         const void* biases, int64_t n, const float* const xr[kMaxRows],
                                         uint32_t mask, int lane, float acc[kMaxRows]) {
  const int64_t chunks = m.cols / 8;
#pragma unroll 4
  for (int64_t c = lane; c < chunks; c += 32) {
    float w[8];
    load_w8<FMT, BITS>(m, data, scales, biases, n, c, w);
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r) {
      if ((mask >> r) & 1u) {
        float x[8];
        load_x8<VEC>(xr[r] + c * 8, x);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[r] = fmaf(x[j], w[j], acc[r]);
      }
    }
  }
}

// The same for a format chosen at run time (one uniform branch per call).
template <bool VEC>
__device__ __forceinline__ void dot_rows_any(const DevMatrix& m, const void* data, const void* scales,
                                             const void* biases, int64_t n, const float* const xr[kMaxRows],
                                             uint32_t mask, int lane, float acc[kMaxRows]) {
  switch (m.fmt) {
    case WFmt::kF32:
      dot_rows<0, 0, VEC>(m, data, scales, biases, n, xr, mask, lane, acc);
      return;
    case WFmt::kF16:
      dot_rows<1, 0, VEC>(m, data, scales, biases, n, xr, mask, lane, acc);
      return;
    case WFmt::kBF16:
      dot_rows<2, 0, VEC>(m, data, scales, biases, n, xr, mask, lane, acc);
      return;
    case WFmt::kAffine:
      switch (m.bits) {
        case 2:
          dot_rows<3, 2, VEC>(m, data, scales, biases, n, xr, mask, lane, acc);
          return;
        case 3:
          dot_rows<3, 3, VEC>(m, data, scales, biases, n, xr, mask, lane, acc);
          return;
        case 4:
          dot_rows<3, 4, VEC>(m, data, scales, biases, n, xr, mask, lane, acc);
          return;
        case 5:
          dot_rows<3, 5, VEC>(m, data, scales, biases, n, xr, mask, lane, acc);
          return;
        case 6:
          dot_rows<3, 6, VEC>(m, data, scales, biases, n, xr, mask, lane, acc);
          return;
        case 7:
          dot_rows<3, 7, VEC>(m, data, scales, biases, n, xr, mask, lane, acc);
          return;
        default:
          dot_rows<3, 8, VEC>(m, data, scales, biases, n, xr, mask, lane, acc);
          return;
      }
  }
}

// Sums acc[r] (r < nr) over the warp by an xor butterfly; every lane gets the sums.
__device__ __forceinline__ void warp_sum_rows(float acc[kMaxRows], int nr) {
#pragma unroll
  for (int r = 0; r < kMaxRows; ++r) {
    if (r < nr) {
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
    }
  }
}

// Fixed-order block sum: xor butterfly in each warp, then the warps' sums in ascending order; every thread
// gets the result. red: at least blockDim.x / 32 floats; the block size must be a multiple of 32.
__device__ __forceinline__ float block_sum(float v, float* red) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();  // red may still be read by a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = red[0];
  const int nw = static_cast<int>(blockDim.x >> 5);
  for (int w = 1; w < nw; ++w) s = s + red[w];
  return s;
}

__device__ __forceinline__ float block_max(float v, float* red) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = red[0];
  const int nw = static_cast<int>(blockDim.x >> 5);
  for (int w = 1; w < nw; ++w) s = fmaxf(s, red[w]);
  return s;
}

inline unsigned grid_for(int64_t n, int block) {
  return static_cast<unsigned>((n + block - 1) / block);
}

}  // namespace pd::cuda
