// Shared by the Gated DeltaNet prefill passes (gdn_prefill.cu, gdn_prefill_chunk.cu, gdn_prefill_state.cu):
// tile constants, the scratch layout and the staging helpers. The algorithm: gdn_prefill.cu.
#pragma once

#include <type_traits>

#include "puredrive/backend/cuda/common.cuh"

namespace pd::cuda::gdn_prefill {

constexpr int kChunk = kGdnPrefillChunk;
constexpr int kThreads = 256;

// e^x for a log decay x <= 0, or 0 below e^-50: as the CPU backend (gdn_chunked.cpp, which flushes these for
// speed); every sum has an undecayed term next to which such a term never shows in fp32.
__device__ __forceinline__ float decay_factor(float x) {
  return x < -50.0f ? 0.0f : expf(x);
}

// The per-segment scratch (gdn_prefill_scratch_floats), rows indexed from the segment's first row.
struct PrefillScratch {
  float* xn;    // [rows, C]: SiLU(conv), q and k l2-normalised
  float* beta;  // [rows, Hv]
  float* g;     // [rows, Hv]: log decays
  float* G;     // [rows, Hv]: running sums of g inside each chunk
  float* u;     // [rows, Hv * Dv]
  float* w;     // [rows, Hv * Dk]
  float* p;     // [chunks, Hv, 64 * 64]
  float* snap;  // [chunks, Hv, Dk * Dv]: the state before each chunk
};

__host__ __device__ inline int64_t channels_of(const GdnLaunch& g) {
  return 2 * int64_t{g.num_k_heads} * g.k_head_dim + int64_t{g.num_v_heads} * g.v_head_dim;
}

__host__ __device__ inline int64_t scratch_floats(int64_t channels, int hv, int dk, int dv,
                                                  const GdnPrefillCaps& caps) {
  return int64_t{caps.rows} * (channels + 3 * int64_t{hv} + int64_t{hv} * (dk + dv)) +
         int64_t{caps.chunks} * hv * (kChunk * kChunk + int64_t{dk} * dv);
}

__device__ inline PrefillScratch prefill_scratch(const GdnLaunch& g) {
  const int64_t rows = g.seg_rows_cap, hv = g.num_v_heads;
  PrefillScratch s;
  s.xn = g.scratch;
  s.beta = s.xn + rows * channels_of(g);
  s.g = s.beta + rows * hv;
  s.G = s.g + rows * hv;
  s.u = s.G + rows * hv;
  s.w = s.u + rows * hv * g.v_head_dim;
  s.p = s.w + rows * hv * g.k_head_dim;
  s.snap = s.p + int64_t{g.seg_chunks_cap} * hv * kChunk * kChunk;
  return s;
}

// Rows [0, L) of a [64, cols] slice (row i at src + i * stride) into a shared tile of row pitch `pitch`,
// zeros in rows L..63, by a block of NT threads. The copies are asynchronous, so all of a tile's are in
// flight at once (one memory latency, not one per trip of a loop); they land at copy_async_wait_all(), and
// the caller's next barrier publishes them. `quads`: 16-byte copies, for cols, pitch and stride multiples of
// 4 and 16-byte aligned src and dst.
template <int NT = kThreads>
__device__ __forceinline__ void stage_rows(float* dst, int pitch, const float* src, int64_t stride, int L,
                                           int cols, bool quads = false) {
  if (quads) {
    const int q = cols / 4;
    for (int e = static_cast<int>(threadIdx.x); e < kChunk * q; e += NT) {
      const int i = e / q, d = 4 * (e % q);
      if (i < L) {
        copy16_async(dst + i * pitch + d, src + i * stride + d);
      } else {
        *reinterpret_cast<float4*>(dst + i * pitch + d) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
    return;
  }
  for (int e = static_cast<int>(threadIdx.x); e < kChunk * cols; e += NT) {
    const int i = e / cols, d = e % cols;
    if (i < L) {
      copy4_async(dst + i * pitch + d, src + i * stride + d);
    } else {
      dst[i * pitch + d] = 0.0f;
    }
  }
}
// Each of NT threads multiplies elements of rows 0..L-1 by their row's factor (after the staged rows landed
// and a barrier published them, or for the elements this thread staged).
template <int NT = kThreads>
__device__ __forceinline__ void scale_rows(float* dst, int pitch, int L, int cols, const float* row_scale) {
  for (int e = static_cast<int>(threadIdx.x); e < L * cols; e += NT) {
    const int i = e / cols, d = e % cols;
    dst[i * pitch + d] *= row_scale[i];
  }
}

// Four floats from a 16-byte aligned shared address into registers.
__device__ __forceinline__ void load4(float (&out)[4], const float* p) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  out[0] = v.x;
  out[1] = v.y;
  out[2] = v.z;
  out[3] = v.w;
}

// Chunk c of a segment whose first chunk has first_len rows: its first row (in the segment) and length.
__device__ __forceinline__ int chunk_start(int c, int first_len) {
  return c == 0 ? 0 : first_len + (c - 1) * kChunk;
}
__device__ __forceinline__ int chunk_len(int c, int first_len, int seg_rows) {
  const int start = chunk_start(c, first_len);
  return min(seg_rows - start, c == 0 ? first_len : kChunk);
}

// Row pitch of the shared tiles read as float4 rows (N and P of the chunk kernel, W and K of the state
// kernel): rows stay 16-byte aligned, and eight rows' float4s fall in eight different bank groups.
__host__ __device__ constexpr int quad_pitch(int cols) {
  return cols + 4;
}

// Calls f(std::integral_constant<int, DK>{}) for a key head dim the kernels are built for (gdn_supported).
template <class F>
void with_key_dim(int dk, F&& f) {
  with_one_of<16, 32, 64, 128, 256>(dk, f);
}
inline constexpr int kKeyDims[] = {16, 32, 64, 128, 256};

// The passes of one segment (rows [r0, r0 + seg_rows) of the step), in launch order.
void launch_prep(const GdnLaunch& g, int r0, int seg_rows, cudaStream_t stream);
void launch_chunk_pass(const GdnLaunch& g, int seg_rows, int first_len, int n_chunks, cudaStream_t stream);
void launch_state_pass(const GdnLaunch& g, int seg_rows, int first_len, int n_chunks, cudaStream_t stream);
void launch_out_pass(const GdnLaunch& g, int r0, int seg_rows, int first_len, int n_chunks,
                     cudaStream_t stream);
// Dynamic shared memory of each pass, and the opt-in above 48 KB for every key dim.
size_t chunk_smem_floats(int dk, int dv);
size_t state_smem_floats(int dk, int cols);
size_t out_smem_floats(int dk);
void set_chunk_smem_limit(size_t bytes);
void set_state_out_smem_limit(size_t bytes);

}  // namespace pd::cuda::gdn_prefill
