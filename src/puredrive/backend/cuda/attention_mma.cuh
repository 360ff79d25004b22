// What the tensor-core attention kernels share (attention_decode.cu, attention_prefill.cu): the K/V tile
// copies, bf16 packing, and the launches attention.cu dispatches to.
//
// The mma and its fragments, the copies and ldmatrix: common.cuh.
#pragma once

#include "puredrive/backend/cuda/attention_plan.h"
#include "puredrive/backend/cuda/common.cuh"

namespace pd::cuda {
namespace attn {

constexpr int kPad = 8;  // bf16 elements of padding per shared-memory row: rows 16 bytes apart in bank terms

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
      copy_or_zero_async<16>(tile + t * ld + ch * 8, valid ? src : cache, valid);
    }
    return;
  }
  for (int i = tid; i < kAttnTile * chunks; i += threads) {
    const int t = i / chunks, ch = i - t * chunks;
    const int pos = t0 + t;
    const bool valid = pos < end;
    const uint16_t* src =
        valid ? cache + static_cast<int64_t>(pos) * kv_width + static_cast<int64_t>(kh) * D + ch * 8 : cache;
    copy_or_zero_async<16>(tile + t * ld + ch * 8, src, valid);
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
// The same on Hopper's wgmma (attention_prefill_wgmma.cu; PD_ATTN_WGMMA=0 turns it off): the shapes it takes.
bool attn_prefill_wgmma_takes(const AttentionLaunch& a);
void launch_attn_prefill_wgmma(const AttentionLaunch& a, const float* qbuf, cudaStream_t stream);

}  // namespace pd::cuda
