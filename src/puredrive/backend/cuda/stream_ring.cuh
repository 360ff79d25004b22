// The weight stream of the decode products (gemv_stream.cu, moe_stream_up.cu, moe_stream_down.cu): one
// producer warp per block copies tiles of 16 weight rows into a ring of shared-memory stages with the bulk
// copy engine (cp.async.bulk, completing on an mbarrier per stage); kConsumers consumer warps multiply each
// stage on the tensor cores (mma m16n8k16: the 16 weight rows as A, the step's up to 8 rows as B, split into
// bf16 hi + lo as in gemv_mma.cu) and release it.
//
// Consumer warp w owns columns [w * kSlice, (w + 1) * kSlice) of every chunk; lane (g, q) reads 16 bytes
// (8 columns) of staged rows g and g + 8 per 32 columns, rows padded so that rows g and g + 1 fall in
// opposite halves of the banks. The 16 warps' partials of an output are summed in warp order
// (tile_output), so a result depends only on its weight row, its activation row and the matrix width.
#pragma once

#include "puredrive/backend/cuda/common.cuh"
#include "puredrive/backend/cuda/gemv_mma.h"

namespace pd::cuda::stream {

constexpr int kTile = kTileN;                    // weight rows per tile (the mma's M)
constexpr int kConsumers = 16;                   // consumer warps
constexpr int kThreads = (kConsumers + 1) * 32;  // and one producer warp (the last)
constexpr int kRowPad = 64;
// Stages in flight per block (one block per SM) for bf16 rows: about 200 KB for 16 rows of 1024 columns.
// (Rings of 64 or 96 KB measured 5% slower decode steps on the H200; 140 KB no different.)
constexpr int kStages = 6;

// K = 512 * KB columns, streamed in chunks of at most 1024 columns.
template <int KB>
struct Shape {
  static constexpr int kCols = 512 * KB;
  static constexpr int kChunk = kCols < 1024 ? kCols : 1024;
  static constexpr int kChunks = kCols / kChunk;
  static constexpr int kSlice = kChunk / kConsumers;  // columns per consumer warp and chunk: 32 or 64
  static constexpr int kBlocks32 = kSlice / 32;
  static constexpr int kRowBytes = kChunk * 2 + kRowPad;
  static constexpr int kStageBytes = kTile * kRowBytes;
  static constexpr int kCopyBytes = kChunk * 2;  // per row
  static constexpr int kFillBytes = kTile * kCopyBytes;
  static constexpr int kStages = stream::kStages;
  static constexpr int kPartSlots = 2;  // the warps' partials: two buffers of one tile
  // The ring, the warps' partials and the barriers.
  static constexpr int kSmemBytes =
      kStages * kStageBytes + kPartSlots * kConsumers * 32 * 16 + 2 * kStages * 8;
};

// The L2 policy of the weight stream's copies: evict first. A step reads each weight once, and lines kept
// by the default policy push out what the next kernels will read (an MoE block's down weights prefetched
// while its gate/up kernel streams, moe_stream_up.cu).
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}
// policy 0: the default.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                          uint64_t policy) {
  if (policy == 0) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
            smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(smem_addr(bar))
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, "
        "[%3], "
        "%4;\n" ::"r"(smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy)
        : "memory");
  }
}
// `bytes` (a multiple of 16) from src (16-byte aligned) into L2, asynchronously.
__device__ __forceinline__ void prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}
// Synchronises the consumer warps only (the producer never joins).
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumers * 32) : "memory");
}

// The block's shared memory: the ring of stages, the warps' partials, a full and an empty barrier per stage.
// Fill f (the f-th stage the producer fills) goes to stage f % S::kStages.
template <typename S>
struct Ring {
  uint8_t* stages;
  float4* part;  // [S::kPartSlots][kConsumers][32]
  uint64_t* full;
  uint64_t* empty;
  uint64_t policy;  // of the copies (bulk_copy)

  __device__ Ring(uint8_t* smem, bool evict_first)
      : stages(smem),
        part(reinterpret_cast<float4*>(smem + S::kStages * S::kStageBytes)),
        full(reinterpret_cast<uint64_t*>(part + S::kPartSlots * kConsumers * 32)),
        empty(full + S::kStages),
        policy(evict_first ? evict_first_policy() : 0) {}

  // Thread 0, then a block barrier.
  __device__ void init() const {
    for (int s = 0; s < S::kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumers);
    }
    mbar_init_fence();
  }
  __device__ static int slot(int f) { return f % S::kStages; }
  __device__ static uint32_t phase(int f) { return static_cast<uint32_t>((f / S::kStages) & 1); }
  __device__ uint8_t* stage(int f) const { return stages + slot(f) * S::kStageBytes; }

  // Producer warp: waits until fill f's stage is free and announces the bytes of its copies (lane 0).
  __device__ void begin_fill(int f, int lane, uint32_t bytes = S::kFillBytes) const {
    if (f >= S::kStages) mbar_wait(&empty[slot(f)], phase(f) ^ 1u);
    if (lane == 0) mbar_expect(&full[slot(f)], bytes);
    __syncwarp();
  }
  // Producer lane `row` (< 16): copies kChunk columns from src into the stage's row.
  __device__ void copy_row(int f, int row, const void* src) const {
    copy(f, row * S::kRowBytes, src, S::kCopyBytes);
  }
  // Producer lane: `bytes` (a multiple of 16) from src to byte `offset` of fill f's stage.
  __device__ void copy(int f, int offset, const void* src, uint32_t bytes) const {
    bulk_copy(stage(f) + offset, src, bytes, &full[slot(f)], policy);
  }
  __device__ void wait_full(int f) const { mbar_wait(&full[slot(f)], phase(f)); }
  // Consumer warp: done reading fill f.
  __device__ void release(int f, int lane) const {
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[slot(f)]);
  }
};

// Lane (g, q)'s B fragments of 32 columns (its 8 values v of row g): hi and lo pairs in mma order.
__device__ __forceinline__ void split_fragment(const float v[8], uint32_t fr[8]) {
  split_pair(v[0], v[1], &fr[0], &fr[2]);
  split_pair(v[2], v[3], &fr[1], &fr[3]);
  split_pair(v[4], v[5], &fr[4], &fr[6]);
  split_pair(v[6], v[7], &fr[5], &fr[7]);
}

// acc += staged rows (g, g + 8) x this warp's B fragments of one chunk (kBlocks32 blocks of 32 columns);
// st: the stage plus the lane's column offset in bytes.
template <typename S>
__device__ __forceinline__ void mma_chunk(float acc[4], const uint8_t* st, int g,
                                          const uint32_t (&fr)[S::kBlocks32][8]) {
#pragma unroll
  for (int h = 0; h < S::kBlocks32; ++h) {
    const uint4 wg = *reinterpret_cast<const uint4*>(st + g * S::kRowBytes + 64 * h);
    const uint4 w8 = *reinterpret_cast<const uint4*>(st + (g + 8) * S::kRowBytes + 64 * h);
    const uint32_t a0[4] = {wg.x, w8.x, wg.y, w8.y}, a1[4] = {wg.z, w8.z, wg.w, w8.w};
    mma_bf16(acc, a0, fr[h][0], fr[h][1]);
    mma_bf16(acc, a0, fr[h][2], fr[h][3]);
    mma_bf16(acc, a1, fr[h][4], fr[h][5]);
    mma_bf16(acc, a1, fr[h][6], fr[h][7]);
  }
}

// A fused input norm (MmaTargets::norm): the inverse rms of each of the step's rows x
// [rows][n], one consumer warp per row, into inv (shared, kMaxRows); every consumer may read it after.
__device__ __forceinline__ void norm_inverses(const float* x, int64_t xs, int rows, int n, float eps,
                                              int warp, int lane, float* inv) {
  if (warp < rows) {
    const float sum = rms_sum_squares_warp(x + warp * xs, n, lane);
    if (lane == 0) inv[warp] = rms_inverse(sum, n, eps);
  }
  consumers_sync();
}

// v = (v * inv) * w[0, 8), as rms_norm_kernel computes its outputs (w 16-byte aligned).
__device__ __forceinline__ void normalize8(float (&v)[8], const float* w, float inv) {
  float wv[8];
  load_x8<true>(w, wv);
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = (v[e] * inv) * wv[e];
}

// The first of the 8 columns of lane (warp, q) in block h of 32 columns of chunk c.
template <typename S>
__device__ __forceinline__ int lane_column(int c, int warp, int h, int q) {
  return c * S::kChunk + warp * S::kSlice + 32 * h + 8 * q;
}

// Lane (g, q)'s activations of every column the warp owns, from xr (row g; zeros unless has_row), as loaded.
template <typename S, bool VEC>
__device__ __forceinline__ void load_activations(const float* xr, bool has_row, int warp, int q,
                                                 float (&v)[S::kChunks][S::kBlocks32][8]) {
#pragma unroll
  for (int c = 0; c < S::kChunks; ++c) {
#pragma unroll
    for (int h = 0; h < S::kBlocks32; ++h) {
      if (has_row) {
        load_x8<VEC>(xr + lane_column<S>(c, warp, h, q), v[c][h]);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[c][h][e] = 0.0f;
      }
    }
  }
}

// Their B fragments; with a norm weight nw, of the normalised row (inv: its norm_inverses).
template <typename S>
__device__ __forceinline__ void make_fragments(float (&v)[S::kChunks][S::kBlocks32][8], bool has_row,
                                               int warp, int q, uint32_t (&frag)[S::kChunks][S::kBlocks32][8],
                                               const float* nw, float inv) {
#pragma unroll
  for (int c = 0; c < S::kChunks; ++c) {
#pragma unroll
    for (int h = 0; h < S::kBlocks32; ++h) {
      if (has_row && nw != nullptr) normalize8(v[c][h], nw + lane_column<S>(c, warp, h, q), inv);
      split_fragment(v[c][h], frag[c][h]);
    }
  }
}

// The byte offset of lane (warp, q)'s columns in a staged row.
template <typename S>
__device__ __forceinline__ int column_bytes(int warp, int q) {
  return (warp * S::kSlice + 8 * q) * 2;
}

// acc += this warp's share of one tile: its chunks, fills *f, *f + 1, ... (*f advanced past them); col:
// the lane's column offset (column_bytes).
template <typename S>
__device__ __forceinline__ void consume_tile(const Ring<S>& ring, int* f, int col, int g, int lane,
                                             const uint32_t (&frag)[S::kChunks][S::kBlocks32][8],
                                             float acc[4]) {
#pragma unroll
  for (int c = 0; c < S::kChunks; ++c, ++*f) {
    ring.wait_full(*f);
    mma_chunk<S>(acc, ring.stage(*f) + col, g, frag[c]);
    ring.release(*f, lane);
  }
}

// Stores this warp's partials of a tile in partial slot `slot`.
__device__ __forceinline__ void stash(float4* part, int slot, int warp, int lane, const float acc[4]) {
  part[(slot * kConsumers + warp) * 32 + lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
}

// Publishes this warp's partials of a tile (buffer buf) and waits for the other consumer warps.
__device__ __forceinline__ void publish(float4* part, int buf, int warp, int lane, const float acc[4]) {
  stash(part, buf, warp, lane, acc);
  consumers_sync();
}

// The tile's output (weight row `off` of the tile, step row r): the consumer warps' partials summed in warp
// order. Element e of lane (off % 8, r / 2) of each warp holds it.
// kWarps: the warps that stashed partials of the tile (the first kWarps of the slot).
template <int kWarps = kConsumers>
__device__ __forceinline__ float tile_output(const float4* part, int buf, int off, int r) {
  const int src = (off & 7) * 4 + (r >> 1), e = (off >= 8 ? 2 : 0) + (r & 1);
  const float* p = reinterpret_cast<const float*>(part + buf * kConsumers * 32);
  float sum = p[src * 4 + e];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) sum += p[(w * 32 + src) * 4 + e];
  return sum;
}

// Raises a stream kernel's dynamic shared-memory limit (once per kernel); returns the number of SMs.
template <typename S, typename K>
inline int prepare_kernel(K kernel) {
  int dev = 0, sms = 132;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes);
  return sms;
}

}  // namespace pd::cuda::stream
