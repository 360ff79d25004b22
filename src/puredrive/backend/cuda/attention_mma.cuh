// What the tensor-core attention kernels share (attention_decode.cu, attention_prefill.cu): asynchronous
// copies with zero fill, ldmatrix, the bf16 mma, and the launches attention.cu dispatches to.
//
// The mma and its fragments: mma_bf16 in common.cuh.
// ldmatrix.x4 loads four 8 x 8 bf16 matrices whose rows (16 bytes each) lanes 8i..8i+7 address, matrix i into
// register i: lane (g, t) receives row g, columns 2t, 2t+1; with .trans, rows 2t, 2t+1 of column g.
#pragma once

#include "puredrive/backend/cuda/attention_plan.h"
#include "puredrive/backend/cuda/common.cuh"

namespace pd::cuda {
namespace attn {

constexpr int kPad = 8;  // bf16 elements of padding per shared-memory row: rows 16 bytes apart in bank terms

// 16 bytes global -> shared (cp.async), or 16 zero bytes without reading when !valid (gmem must still be a
// valid address).
__device__ __forceinline__ void copy16_or_zero(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n) : "memory");
}
__device__ __forceinline__ void copy_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N of this thread's committed copy groups are still in flight.
template <int N>
__device__ __forceinline__ void copy_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* p) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* p) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s)
               : "memory");
}

using cuda::mma_bf16;

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  return static_cast<uint32_t>(to_bf16_bits(lo)) | (static_cast<uint32_t>(to_bf16_bits(hi)) << 16);
}

// Two consecutive bf16 of shared memory (even index) as one register.
__device__ __forceinline__ uint32_t ld_pair(const uint16_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// x = hi + lo to about 16 significant bits: hi = bf16(x), lo = bf16(x - hi) (x - hi is exact in f32).
__device__ __forceinline__ void split_bf16(float x, uint16_t* hi, uint16_t* lo) {
  const uint16_t h = to_bf16_bits(x);
  *hi = h;
  *lo = to_bf16_bits(x - bf16_bits(h));
}

// Issues the copies of keys (or values) [t0, t0 + kAttnTile) of KV head kh into tile[kAttnTile][D + kPad];
// positions at or past `end` are zero-filled, not read. A thread copies one 16-byte chunk column of every
// blockDim / (D / 8)-th key: one division per tile, not one per copy (the integer work of the division was
// the decode kernel's busiest pipe at long contexts).
__device__ __forceinline__ void issue_kv_tile(uint16_t* tile, const uint16_t* cache, int64_t kv_width, int kh,
                                              int D, int t0, int end) {
  const int chunks = D / 8, ld = D + kPad, threads = static_cast<int>(blockDim.x);
  const int tid = static_cast<int>(threadIdx.x);
  if (threads % chunks == 0) {
    const int step = threads / chunks, ch = tid % chunks;
    int t = tid / chunks;
    const uint16_t* src =
        cache + static_cast<int64_t>(t0 + t) * kv_width + static_cast<int64_t>(kh) * D + ch * 8;
    const int64_t src_step = static_cast<int64_t>(step) * kv_width;
    for (; t < kAttnTile; t += step, src += src_step) {
      const bool valid = t0 + t < end;
      copy16_or_zero(tile + t * ld + ch * 8, valid ? src : cache, valid);
    }
    return;
  }
  for (int i = tid; i < kAttnTile * chunks; i += threads) {
    const int t = i / chunks, ch = i - t * chunks;
    const int pos = t0 + t;
    const bool valid = pos < end;
    const uint16_t* src =
        valid ? cache + static_cast<int64_t>(pos) * kv_width + static_cast<int64_t>(kh) * D + ch * 8 : cache;
    copy16_or_zero(tile + t * ld + ch * 8, src, valid);
  }
}

}  // namespace attn

// ---- Launches of the tensor-core kernels (arguments validated by launch_attention) ----

// Decode / verify (bf16 cache): the split-K partials of the step's rows [r0, r0 + rows) from their normalised
// queries qbuf [rows][Hq][D] into part_o [rows][Hq][attn_max_splits][D] and part_ml [.][2] (max, sum).
bool attn_decode_supported(const AttentionLaunch& a);
int attn_decode_rows_per_launch(const AttentionLaunch& a);  // 0: the shared memory limit allows none
void launch_attn_decode(const AttentionLaunch& a, int r0, int rows, const float* qbuf, float* part_o,
                        float* part_ml, cudaStream_t stream);
void set_attn_decode_smem_limit(size_t bytes);

// Prefill (rows > kMaxRows, bf16 cache): the gated output of every row from qbuf [R][Hq][D].
bool attn_prefill_supported(const AttentionLaunch& a);
void launch_attn_prefill(const AttentionLaunch& a, const float* qbuf, cudaStream_t stream);
void set_attn_prefill_smem_limit(size_t bytes);

}  // namespace pd::cuda
