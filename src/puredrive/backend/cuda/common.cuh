// Device helpers shared by the kernels: weight decoding (8 columns at a time), the row-exact dot product of
// one warp, fixed-order block reductions, programmatic dependent launch; with the tensor-core and
// asynchronous-copy primitives of tensor_core.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "puredrive/backend/cuda/kernels.h"
#include "puredrive/backend/cuda/tensor_core.cuh"

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
struct Fmt {
  static constexpr int kFmt = FMT;
  static constexpr int kBits = BITS;
};

// A kernel template argument meaning "the format of each matrix, dispatched at run time".
constexpr int kAnyFmt = -1;

// Calls f(Fmt<FMT, BITS>{}) for a format known at run time: the one switch over weight formats.
template <typename F>
__host__ __device__ __forceinline__ void with_format(WFmt fmt, int bits, F&& f) {
  switch (fmt) {
    case WFmt::kF32:
      f(Fmt<0, 0>{});
      return;
    case WFmt::kF16:
      f(Fmt<1, 0>{});
      return;
    case WFmt::kBF16:
      f(Fmt<2, 0>{});
      return;
    case WFmt::kAffine:
      switch (bits) {
        case 2:
          f(Fmt<3, 2>{});
          return;
        case 3:
          f(Fmt<3, 3>{});
          return;
        case 4:
          f(Fmt<3, 4>{});
          return;
        case 5:
          f(Fmt<3, 5>{});
          return;
        case 6:
          f(Fmt<3, 6>{});
          return;
        case 7:
          f(Fmt<3, 7>{});
          return;
        default:
          f(Fmt<3, 8>{});
          return;
      }
  }
}

// Eight weights as loaded, before decoding: the registers a load keeps in flight (4 for 16-bit formats, 2-4
// for affine codes and their group's scale and bias). Only the fields of the format are used.
struct RawW8 {
  float4 f0, f1;  // f32
  uint4 h;        // f16 / bf16
  uint64_t v;     // affine codes
  float scale, bias;
};

// The scale dtype of affine weights as a template constant (an SDType value), or kAnySd: read at run time.
// A product's inner loop takes the constant (with_scale_dtype): the run-time switch, two per 8 codes, was a
// third of an affine product's instructions.
constexpr int kAnySd = -1;

template <int SD>
__device__ __forceinline__ float scale_of(const void* p, SDType t, int64_t i) {
  if constexpr (SD == kAnySd) {
    return scale_at(p, t, i);
  } else if constexpr (SD == static_cast<int>(SDType::kBF16)) {
    return bf16_bits(__ldg(static_cast<const uint16_t*>(p) + i));
  } else if constexpr (SD == static_cast<int>(SDType::kF16)) {
    return f16_bits(__ldg(static_cast<const uint16_t*>(p) + i));
  } else {
    return __ldg(static_cast<const float*>(p) + i);
  }
}

// Calls f(std::integral_constant<int, SD>{}) with SD the constant for scale dtype t (affine FMT), or kAnySd
// for dense formats, which have no scales.
template <int FMT, typename F>
__device__ __forceinline__ void with_scale_dtype(SDType t, F&& f) {
  if constexpr (FMT != static_cast<int>(WFmt::kAffine)) {
    f(std::integral_constant<int, kAnySd>{});
  } else {
    switch (t) {
      case SDType::kBF16:
        f(std::integral_constant<int, static_cast<int>(SDType::kBF16)>{});
        return;
      case SDType::kF16:
        f(std::integral_constant<int, static_cast<int>(SDType::kF16)>{});
        return;
      default:
        f(std::integral_constant<int, static_cast<int>(SDType::kF32)>{});
        return;
    }
  }
}

// The eight BITS-bit codes of columns [8c, 8c + 8) of an affine row starting at `row` (4-byte aligned, 8 for
// 8-bit codes), as stored: MLX affine codes are LSB-first in the row's bit stream, so 8 codes start at byte
// c * BITS. GLOBAL: read through the read-only cache (else, e.g., from shared memory).
template <int BITS, bool GLOBAL = true>
__device__ __forceinline__ uint64_t affine_codes8(const uint8_t* row, int64_t c) {
  const auto load = [](const auto* p) {
    if constexpr (GLOBAL) {
      return __ldg(p);
    } else {
      return *p;
    }
  };
  const uint8_t* p = row + c * BITS;
  if constexpr (BITS == 8) {
    const uint2 q = load(reinterpret_cast<const uint2*>(p));
    return static_cast<uint64_t>(q.x) | (static_cast<uint64_t>(q.y) << 32);
  } else if constexpr (BITS == 4) {
    return load(reinterpret_cast<const uint32_t*>(p));
  } else if constexpr (BITS == 2) {
    return load(reinterpret_cast<const uint16_t*>(p));
  } else if constexpr (BITS == 6) {
    // The 6 bytes start at c * 6, 4-byte aligned for even c and 2 past it for odd c: two aligned words
    // hold them (two loads instead of three 16-bit ones).
    const uint32_t* w = reinterpret_cast<const uint32_t*>(p - (c & 1) * 2);
    const uint64_t both = static_cast<uint64_t>(load(w)) | (static_cast<uint64_t>(load(w + 1)) << 32);
    return (both >> ((c & 1) * 16)) & 0xffffffffffffull;
  } else {
    uint64_t v = 0;
#pragma unroll
    for (int i = 0; i < BITS; ++i) v |= static_cast<uint64_t>(load(p + i)) << (8 * i);
    return v;
  }
}

// Columns [8c, 8c + 8) of row n of m (data/scales/biases already offset to the expert).
template <int FMT, int BITS, int SD = kAnySd>
__device__ __forceinline__ RawW8 load_raw8(const DevMatrix& m, const void* data, const void* scales,
                                           const void* biases, int64_t n, int64_t c) {
  RawW8 r;
  if constexpr (FMT == static_cast<int>(WFmt::kF32)) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(data) + n * m.cols + c * 8);
    r.f0 = __ldg(p);
    r.f1 = __ldg(p + 1);
  } else if constexpr (FMT == static_cast<int>(WFmt::kBF16) || FMT == static_cast<int>(WFmt::kF16)) {
    r.h = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(data) + n * m.cols + c * 8));
  } else {
    const int64_t row_bytes = m.cols * BITS / 8;
    r.v = affine_codes8<BITS>(static_cast<const uint8_t*>(data) + n * row_bytes, c);
    // group_size is 32, 64 or 128 (validate_matrix): a shift instead of two 64-bit divisions per load,
    // which cost as much as the chunk's arithmetic.
    const int shift = __ffs(m.group_size) - 1;
    const int64_t gi = n * (m.cols >> shift) + ((static_cast<uint32_t>(c) * 8u) >> shift);
    r.scale = scale_of<SD>(scales, m.scale_dtype, gi);
    r.bias = scale_of<SD>(biases, m.scale_dtype, gi);
  }
  return r;
}

// The eight weights as f32. Affine: w = scale * q + bias with two roundings (no fused multiply-add), as the
// CPU backend computes it.
template <int FMT, int BITS>
__device__ __forceinline__ void decode8(const RawW8& r, float w[8]) {
  if constexpr (FMT == static_cast<int>(WFmt::kF32)) {
    w[0] = r.f0.x, w[1] = r.f0.y, w[2] = r.f0.z, w[3] = r.f0.w;
    w[4] = r.f1.x, w[5] = r.f1.y, w[6] = r.f1.z, w[7] = r.f1.w;
  } else if constexpr (FMT == static_cast<int>(WFmt::kBF16) || FMT == static_cast<int>(WFmt::kF16)) {
    const uint32_t u[4] = {r.h.x, r.h.y, r.h.z, r.h.w};
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
    constexpr uint64_t kMask = (1ull << BITS) - 1ull;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float product = r.scale * static_cast<float>(static_cast<uint32_t>((r.v >> (BITS * j)) & kMask));
      w[j] = product + r.bias;
    }
  }
}

template <int FMT, int BITS>
__device__ __forceinline__ void load_w8(const DevMatrix& m, const void* data, const void* scales,
                                        const void* biases, int64_t n, int64_t c, float w[8]) {
  decode8<FMT, BITS>(load_raw8<FMT, BITS>(m, data, scales, biases, n, c), w);
}

// The same for a format chosen at run time.
__device__ __forceinline__ void load_w8_any(const DevMatrix& m, const void* data, const void* scales,
                                            const void* biases, int64_t n, int64_t c, float w[8]) {
  with_format(m.fmt, m.bits, [&](auto f) {
    load_w8<decltype(f)::kFmt, decltype(f)::kBits>(m, data, scales, biases, n, c, w);
  });
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

// Lane l of the warp that owns output n accumulates, for every row r < NR in mask, the columns of its chunks
// c = l, l + 32, ... (8 columns each, in order) of the dot product of weight row n with xr[r]. A row's
// partial sums never depend on the other rows or on NR, so the result is the same for any R or mask.
// The raw loads of up to kBatch chunks of a lane (a whole 2048-column row of a 16-bit or affine matrix) are
// issued before their products, so a warp reads such a row in one round trip; the summation order is
// unchanged. (16 chunks, measured on the H200, cost more in occupancy than they gained.) NR (the rows a
// launch handles, chosen from R) sizes the accumulators, so a one-row step does not pay registers for eight.
// The two-matrix form reads row n of m and of m2 (an expert's gate and up) in one round trip; each result is
// bitwise the one-matrix result.
template <int FMT>
constexpr int dot_batch() {
  return FMT == static_cast<int>(WFmt::kF32) ? 4 : 8;
}

template <int FMT, int BITS, int NR, bool VEC>
__device__ __forceinline__ void fma_chunk(const RawW8& raw, const float* const xr[NR], int64_t c,
                                          uint32_t mask, float acc[NR]) {
  float w[8];
  decode8<FMT, BITS>(raw, w);
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    if ((mask >> r) & 1u) {
      float x[8];
      load_x8<VEC>(xr[r] + c * 8, x);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[r] = fmaf(x[j], w[j], acc[r]);
    }
  }
}

// The same for two matrices' chunks with one load of the activations (each accumulator sums in fma_chunk's
// order).
template <int FMT, int BITS, int NR, bool VEC>
__device__ __forceinline__ void fma_chunk2(const RawW8& raw, const RawW8& raw2, const float* const xr[NR],
                                           int64_t c, uint32_t mask, float acc[NR], float acc2[NR]) {
  float w[8], w2[8];
  decode8<FMT, BITS>(raw, w);
  decode8<FMT, BITS>(raw2, w2);
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    if ((mask >> r) & 1u) {
      float x[8];
      load_x8<VEC>(xr[r] + c * 8, x);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[r] = fmaf(x[j], w[j], acc[r]);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc2[r] = fmaf(x[j], w2[j], acc2[r]);
    }
  }
}

// Chunks [begin, end) only when end >= 0 (a slice of the row, lanes from its first chunk), else the whole
// row; BATCH: chunks per lane in flight.
template <int FMT, int BITS, bool VEC, int NR, int BATCH = dot_batch<FMT>()>
__device__ __forceinline__ void dot_rows(const DevMatrix& m, const void* data, const void* scales,
                                         const void* biases, int64_t n, const float* const xr[NR],
                                         uint32_t mask, int lane, float acc[NR], int64_t begin = 0,
                                         int64_t end = -1) {
  constexpr int kBatch = BATCH;
  const int64_t chunks = end < 0 ? m.cols / 8 : end;
  with_scale_dtype<FMT>(m.scale_dtype, [&](auto sd) {
    constexpr int SD = decltype(sd)::value;
    for (int64_t c0 = begin + lane; c0 < chunks; c0 += 32 * kBatch) {
      RawW8 raw[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int64_t c = c0 + 32 * u;
        if (c < chunks) raw[u] = load_raw8<FMT, BITS, SD>(m, data, scales, biases, n, c);
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int64_t c = c0 + 32 * u;
        if (c >= chunks) break;
        fma_chunk<FMT, BITS, NR, VEC>(raw[u], xr, c, mask, acc);
      }
    }
  });
}

template <int FMT, int BITS, bool VEC, int NR>
__device__ __forceinline__ void dot_rows2(const DevMatrix& m, const void* data, const void* scales,
                                          const void* biases, const DevMatrix& m2, const void* data2,
                                          const void* scales2, const void* biases2, int64_t n,
                                          const float* const xr[NR], uint32_t mask, int lane, float acc[NR],
                                          float acc2[NR]) {
  constexpr int kBatch = dot_batch<FMT>() / 2;
  const int64_t chunks = m.cols / 8;
  auto loop = [&](auto sd) {
    constexpr int SD = decltype(sd)::value;
    for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kBatch) {
      RawW8 raw[kBatch], raw2[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int64_t c = c0 + 32 * u;
        if (c < chunks) {
          raw[u] = load_raw8<FMT, BITS, SD>(m, data, scales, biases, n, c);
          raw2[u] = load_raw8<FMT, BITS, SD>(m2, data2, scales2, biases2, n, c);
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int64_t c = c0 + 32 * u;
        if (c >= chunks) break;
        fma_chunk2<FMT, BITS, NR, VEC>(raw[u], raw2[u], xr, c, mask, acc, acc2);
      }
    }
  };
  if constexpr (FMT == static_cast<int>(WFmt::kAffine)) {
    if (m.scale_dtype == m2.scale_dtype) {
      with_scale_dtype<FMT>(m.scale_dtype, loop);
      return;
    }
  }
  loop(std::integral_constant<int, kAnySd>{});
}

// The same for a format chosen at run time (one uniform branch per call).
template <bool VEC, int NR>
__device__ __forceinline__ void dot_rows_any(const DevMatrix& m, const void* data, const void* scales,
                                             const void* biases, int64_t n, const float* const xr[NR],
                                             uint32_t mask, int lane, float acc[NR]) {
  with_format(m.fmt, m.bits, [&](auto f) {
    dot_rows<decltype(f)::kFmt, decltype(f)::kBits, VEC, NR>(m, data, scales, biases, n, xr, mask, lane, acc);
  });
}

// Rows per launch of the row-batched kernels for a step of `rows` rows (<= kMaxRows): 1, 4 or 8.
inline int rows_class(int rows) {
  return rows <= 1 ? 1 : (rows <= 4 ? 4 : kMaxRows);
}

// Calls f(std::integral_constant<int, V>{}) for the V of Vs equal to v (a value known at run time, for a
// kernel template argument); false, calling nothing, when none is.
template <int... Vs, typename F>
bool with_one_of(int v, F&& f) {
  return ((v == Vs && (f(std::integral_constant<int, Vs>{}), true)) || ...);
}

// Calls f(std::integral_constant<int, NR>{}) for NR = rows_class(rows).
template <typename F>
void with_rows_class(int rows, F&& f) {
  with_one_of<1, 4, kMaxRows>(rows_class(rows), f);
}

// Sums acc[r] (r < nr) over the warp by an xor butterfly; every lane gets the sums.
template <int NR>
__device__ __forceinline__ void warp_sum_rows(float acc[NR], int nr) {
#pragma unroll
  for (int r = 0; r < NR; ++r) {
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

// RMSNorm (rms_norm_kernel, and the input norms fused into the decode products, InputNorm): the row's sum of
// squares as a block of kBlock threads forms it, thread t's fma chain over t, t + kBlock, ..., each warp's
// xor butterfly, then the warps' sums in ascending order; out = (x * inverse) * weight.
__device__ __forceinline__ float rms_inverse(float sum_squares, int n, float eps) {
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sum_squares, static_cast<float>(n)), eps)));
}

// The same sum of squares of x[0, n) by one warp, bit for bit: lane l keeps the chains of threads l, l + 32,
// ... of the block.
__device__ __forceinline__ float rms_sum_squares_warp(const float* x, int n, int lane) {
  constexpr int kWarps = kBlock / 32;
  float s[kWarps] = {};
  for (int base = 0; base < n; base += kBlock) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const int i = base + 32 * w + lane;
      if (i < n) s[w] = fmaf(x[i], x[i], s[w]);
    }
  }
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s[w] += __shfl_xor_sync(0xffffffffu, s[w], off);
    total = w == 0 ? s[0] : total + s[w];
  }
  return total;
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

// Programmatic dependent launch (sm_90): a kernel launched by launch_pdl may be scheduled while its
// predecessor in the stream is still finishing. pdl_enter() lets the next kernel be scheduled likewise, then
// waits until the predecessor has completed and its writes are visible: every such kernel calls it before it
// reads or writes memory that another kernel touches (weights, which nothing writes, may be read earlier).
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
__device__ __forceinline__ void pdl_wait() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
__device__ __forceinline__ void pdl_enter() {
  pdl_launch_dependents();
  pdl_wait();
}

// mbarriers (sm_90): a phase completes when its arrivals and its expected transaction bytes have come.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// Makes this thread's mbarrier inits visible to the cluster (other blocks may arrive on them, or send to
// them).
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Whether the phase of parity `parity` has completed (after a bounded wait in hardware).
__device__ __forceinline__ bool mbar_test(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, "
      "p;\n}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  while (!mbar_test(bar, parity)) {
  }
}
// Cluster barrier halves without memory ordering (barrier.cluster.arrive.relaxed): for a kernel whose
// blocks only need to know that the others got this far, not to see their writes (a release arrive waits
// until every store the thread issued, global ones too, has been acknowledged).
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}
// Stores v into the shared memory of cluster block `rank` at the address that p has in this block, and
// counts its 4 bytes on that block's mbarrier (at bar's address there): the receiver sees v once its
// phase completes, and the sender waits on nothing.
__device__ __forceinline__ void store_remote(float* p, float v, uint64_t* bar, uint32_t rank) {
  uint32_t rp, rb;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(rp) : "r"(smem_addr(p)), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(rb) : "r"(smem_addr(bar)), "r"(rank));
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(rp),
               "r"(__float_as_uint(v)), "r"(rb)
               : "memory");
}

template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

__device__ __forceinline__ void prefetch_bytes_l2(const void* p, int64_t bytes, int lane) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = static_cast<int64_t>(lane) * 128; off < bytes; off += 32 * 128) {
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(c + off));
  }
}

// Asks L2 for the bytes of weight row n (one 128-byte line per lane step), and an affine row's scales and
// biases: issued before pdl_wait(), so the first loads of a matrix-vector kernel overlap the previous
// kernel's tail. (Without the scales and biases, the 8-bit router's products waited on DRAM for them.)
__device__ __forceinline__ void prefetch_row_l2(const DevMatrix& m, const void* data, int64_t n, int lane) {
  const int64_t row_bytes = m.fmt == WFmt::kF32      ? m.cols * 4
                            : m.fmt == WFmt::kAffine ? m.cols * m.bits / 8
                                                     : m.cols * 2;
  prefetch_bytes_l2(static_cast<const char*>(data) + n * row_bytes, row_bytes, lane);
  if (m.fmt == WFmt::kAffine) {
    const int64_t meta = m.cols / m.group_size * (m.scale_dtype == SDType::kF32 ? 4 : 2);
    prefetch_bytes_l2(static_cast<const char*>(m.scales) + n * meta, meta, lane);
    prefetch_bytes_l2(static_cast<const char*>(m.biases) + n * meta, meta, lane);
  }
}

// Resident blocks of a kernel on the device (the persistent grid).
template <typename K>
inline unsigned resident_blocks(K kernel) {
  int dev = 0, sms = 132, per = 1;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kernel, kBlock, 0);
  return static_cast<unsigned>(sms * (per > 0 ? per : 1));
}

inline unsigned grid_for(int64_t n, int block) {
  return static_cast<unsigned>((n + block - 1) / block);
}

}  // namespace pd::cuda
