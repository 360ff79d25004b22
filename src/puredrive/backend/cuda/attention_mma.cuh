// What the tensor-core attention kernels share (attention_decode.cu, attention_prefill.cu,
// attention_prefill_wgmma.cu): the K/V tile copies, bf16 packing, the prefill kernels' softmax step, and the
// launches attention.cu dispatches to.
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

// A prefill query tile's rows: the step's rows whose positions fall in one 64-aligned block of positions. The
// first row sits at position p0, so tile boundaries fall where p0 + r is a multiple of 64 (for the
// consecutive positions a model step has; any positions stay correct). Rows [rb, rb + nr) of tile qt; nr <=
// 0: none.
struct QueryTile {
  int rb, nr;
};
__device__ __forceinline__ QueryTile query_tile(const AttentionLaunch& a, int qt) {
  const int32_t p0 = a.positions[0];
  const int lead = ((p0 % kAttnTile) + kAttnTile) % kAttnTile;
  const int rb = qt * kAttnTile - lead > 0 ? qt * kAttnTile - lead : 0;
  const int re = (qt + 1) * kAttnTile - lead < a.rows ? (qt + 1) * kAttnTile - lead : a.rows;
  return {rb, re - rb};
}
// Thread tid < 64 writes the position of the tile's row tid into spos (-1: past the tile, or not a position
// of the cache).
__device__ __forceinline__ void tile_positions(const AttentionLaunch& a, QueryTile q, int tid, int* spos) {
  if (tid < kAttnTile) {
    int p = -1;
    if (tid < q.nr) {
      p = a.positions[static_cast<int64_t>(q.rb + tid) * a.position_stride];
      if (p < 0 || p >= a.capacity) p = -1;
    }
    spos[tid] = p;
  }
}

// The prefill kernels' online-softmax step over one 64-key tile, for a warp's rows g (at position pos0) and
// g + 8 (pos1) of its 16: sc(nb, e) is this lane's score of key k0 + 8 nb + 2 t + (e & 1), row g for e < 2
// and g + 8 for e >= 2 (an m16n8 accumulator per key block nb). The scores become probabilities (exactly zero
// past a row's position), the running maxima m and sums l move on, and al0 / al1 are what the rows' outputs
// must be scaled by. Every reduction has a fixed order per row.
template <class Scores>
__device__ __forceinline__ void softmax_tile(Scores sc, int k0, int t, int pos0, int pos1, float sl2,
                                             float& m0, float& m1, float& l0, float& l1, float& al0,
                                             float& al1) {
  float mt0 = -INFINITY, mt1 = -INFINITY;
#pragma unroll
  for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int key = k0 + nb * 8 + 2 * t + e;
      if (key <= pos0) mt0 = fmaxf(mt0, sc(nb, e));
      if (key <= pos1) mt1 = fmaxf(mt1, sc(nb, 2 + e));
    }
  }
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    mt0 = fmaxf(mt0, __shfl_xor_sync(0xffffffffu, mt0, off));
    mt1 = fmaxf(mt1, __shfl_xor_sync(0xffffffffu, mt1, off));
  }
  const float n0 = fmaxf(m0, mt0), n1 = fmaxf(m1, mt1);
  // A row without a valid key so far (padding, invalid position) keeps everything at zero.
  al0 = n0 == -INFINITY ? 1.0f : exp2f((m0 - n0) * sl2);
  al1 = n1 == -INFINITY ? 1.0f : exp2f((m1 - n1) * sl2);
  float rs0 = 0.0f, rs1 = 0.0f;
#pragma unroll
  for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int key = k0 + nb * 8 + 2 * t + e;
      const float p0v = key <= pos0 ? exp2f((sc(nb, e) - n0) * sl2) : 0.0f;
      const float p1v = key <= pos1 ? exp2f((sc(nb, 2 + e) - n1) * sl2) : 0.0f;
      sc(nb, e) = p0v;
      sc(nb, 2 + e) = p1v;
      rs0 = rs0 + p0v;
      rs1 = rs1 + p1v;
    }
  }
  l0 = l0 * al0 + rs0;
  l1 = l1 * al1 + rs1;
  m0 = n0;
  m1 = n1;
}

// The tile's probabilities (softmax_tile's sc) as bf16 A fragments of P V, one per k16 step: key blocks 2 kk
// and 2 kk + 1 are step kk's.
template <class Scores>
__device__ __forceinline__ void probability_fragments(Scores sc, uint32_t (&pa)[4][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    pa[kk][0] = pack_bf16(sc(2 * kk, 0), sc(2 * kk, 1));
    pa[kk][1] = pack_bf16(sc(2 * kk, 2), sc(2 * kk, 3));
    pa[kk][2] = pack_bf16(sc(2 * kk + 1, 0), sc(2 * kk + 1, 1));
    pa[kk][3] = pack_bf16(sc(2 * kk + 1, 2), sc(2 * kk + 1, 3));
  }
}

// The prefill kernels' end: each row's sum over its quad (each lane summed its own keys), then
// out = (o / l) * sigmoid(gate) for rows g and g + 8 of a warp's 16 (step rows rb + 16 warp + g + 8 half,
// those below nr), zeros for a row without a valid position. acc(n, e): this lane's output accumulator of
// dims 8 n + 2 t + (e & 1), row g for e < 2 and g + 8 for e >= 2.
template <int D, class Acc>
__device__ __forceinline__ void write_gated_rows(const AttentionLaunch& a, int h, int rb, int nr, int warp,
                                                 int g, int t, int pos0, int pos1, float l0, float l1,
                                                 Acc acc) {
  l0 = l0 + __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 = l0 + __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 = l1 + __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 = l1 + __shfl_xor_sync(0xffffffffu, l1, 2);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = warp * 16 + g + 8 * half;
    if (r >= nr) continue;
    const int64_t row = rb + r;
    const bool valid = (half == 0 ? pos0 : pos1) >= 0;
    const float l = half == 0 ? l0 : l1;
    const float* gate = a.qg + row * a.qg_stride + static_cast<int64_t>(h) * 2 * D + D;
    float* out = a.out + row * a.out_stride + static_cast<int64_t>(h) * D;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      const int d = n * 8 + 2 * t;
      out[d] = valid ? (acc(n, 2 * half) / l) * sigmoidf_(gate[d]) : 0.0f;
      out[d + 1] = valid ? (acc(n, 2 * half + 1) / l) * sigmoidf_(gate[d + 1]) : 0.0f;
    }
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
