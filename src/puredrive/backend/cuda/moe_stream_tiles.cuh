// The experts of a decode MoE block (1..kMaxRows rows) on the weight stream of stream_ring.cuh, for bf16 or
// affine 4-, 6- or 8-bit experts: what the router + gate/up kernel (moe_stream_up.cu) and the down + combine
// kernel (moe_stream_down.cu) share: how a tile is copied and multiplied (Bf16Tiles, AffineTiles), the
// route's slot table, the launch.
//
// Why: the CUDA-core expert kernels reach 1.6-2.5 TB/s; an expert's 2-4 MB are too few bytes for warps
// that wait on their own loads, and a verify step's rows cost them per-row work. Here each SM's producer
// warp streams tiles of 16 weight rows and the tensor cores serve all rows at once.
//
// Row-exact: each product is the tensor-core product of gemv_stream.cu (a result depends on its weight
// row, its activation row and the width only), and the combine of an output reads that row's values only.
#pragma once

#include "puredrive/backend/cuda/moe_stream.h"
#include "puredrive/backend/cuda/stream_affine.cuh"

namespace pd::cuda::moe_tiles {

using namespace stream;

constexpr int kStreamTopK = 16;                    // experts per row the slot table holds
constexpr int kMaxSlots = kMaxRows * kStreamTopK;  // used experts of one step
// The one pair of code widths taken for routed and shared experts that differ (the oq6e recipe).
constexpr int kMixedRoutedBits = 6, kMixedSharedBits = 8;

// The slot of expert used[u] in row r's selection (-1: not selected) and its weight, for every used expert
// and row: built once per block by the consumer warps.
struct SlotTable {
  int8_t slot[kMaxSlots][kMaxRows];
  float wt[kMaxSlots][kMaxRows];
};

// From the route: sel/wts [rows][top_k], used [count] (global or shared memory).
__device__ inline void build_slots(const MoeStreamArgs& a, const int* sel, const float* wts, const int* used,
                                   int count, SlotTable* t) {
  const int K = a.m.top_k;
  for (int i = static_cast<int>(threadIdx.x); i < count * kMaxRows; i += kConsumers * 32) {
    const int u = i / kMaxRows, r = i % kMaxRows;
    const int e = used[u];
    int slot = -1;
    if (r < a.rows) {
      for (int k = 0; k < K; ++k) {
        if (sel[r * K + k] == e) slot = k;
      }
    }
    t->slot[u][r] = static_cast<int8_t>(slot);
    t->wt[u][r] = slot >= 0 ? wts[r * K + slot] : 0.0f;
  }
  consumers_sync();
}

__device__ __forceinline__ const uint8_t* expert_bytes(const void* base, int64_t stride, int e) {
  return static_cast<const uint8_t*>(base) + static_cast<int64_t>(e) * stride;
}

// Half a tile: 8 consecutive rows from n0 of expert e of matrix m (rows 0-7 or 8-15 of the tile).
struct Half {
  const DevMatrix* m;
  int e;
  int64_t n0;
};

// How a kernel's tiles are copied and multiplied, per weight format. Raw: a lane's activations of one row
// as loaded; X: what the products take (load_raw + make); fill: the producer's copies of one tile (of the
// shared expert or not); consume: acc += the tile x X; kTilesPerSync: tiles multiplied between two
// exchanges of the warps' partials (stream_affine.cuh).
template <int KB>
struct Bf16Tiles {
  using S = Shape<KB>;
  static constexpr int kRouterFmt = static_cast<int>(WFmt::kBF16);
  static constexpr int kTilesPerSync = 1;
  static constexpr int kFillStages = S::kChunks;  // stages per tile
  using Raw = float[S::kChunks][S::kBlocks32][8];
  struct X {
    uint32_t frag[S::kChunks][S::kBlocks32][8];
  };
  __device__ explicit Bf16Tiles(const DevMatrix&) {}

  __device__ static void load_raw(const float* row, bool vec, int warp, int q, Raw& v) {
#pragma unroll
    for (int c = 0; c < S::kChunks; ++c) {
#pragma unroll
      for (int h = 0; h < S::kBlocks32; ++h) {
        const float* p = row + c * S::kChunk + warp * S::kSlice + 32 * h + 8 * q;
        if (row == nullptr) {
#pragma unroll
          for (int i = 0; i < 8; ++i) v[c][h][i] = 0.0f;
        } else if (vec) {
          load_x8<true>(p, v[c][h]);
        } else {
          load_x8<false>(p, v[c][h]);
        }
      }
    }
  }
  __device__ static void make(const Raw& v, int, X& x) {
#pragma unroll
    for (int c = 0; c < S::kChunks; ++c) {
#pragma unroll
      for (int h = 0; h < S::kBlocks32; ++h) split_fragment(v[c][h], x.frag[c][h]);
    }
  }
  __device__ void fill(const Ring<S>& ring, int* f, int lane, bool, const Half& h0, const Half& h1) const {
    const Half& h = lane < 8 ? h0 : h1;
    const uint16_t* row = reinterpret_cast<const uint16_t*>(expert_bytes(h.m->data, h.m->data_stride, h.e)) +
                          (h.n0 + (lane & 7)) * S::kCols;
    for (int c = 0; c < S::kChunks; ++c, ++*f) {
      ring.begin_fill(*f, lane);
      if (lane < kTile) ring.copy_row(*f, lane, row + c * S::kChunk);
    }
  }
  __device__ void consume(const Ring<S>& ring, int* f, bool, int warp, int lane, const X& x,
                          float acc[4]) const {
    consume_tile(ring, f, column_bytes<S>(warp, lane & 3), lane >> 2, lane, x.frag, acc);
  }
};

// Affine (stream_affine.cuh): one stage per tile, each half's scales and biases one copy each. The routed
// experts' codes have BITS bits, the shared expert's SHARED_BITS (the oq6e recipe: 6 and 8), with the same
// group size and scale dtype; a stage has room for the wider.
template <int KB, int BITS, int PPS, int SHARED_BITS = BITS>
struct AffineTiles {
  using SR = AffineShape<KB, BITS>;
  using SS = AffineShape<KB, SHARED_BITS>;
  using S = AffineShape<KB, (BITS > SHARED_BITS ? BITS : SHARED_BITS)>;
  static constexpr int kRouterFmt = static_cast<int>(WFmt::kAffine);  // 8-bit, whatever the experts' width
  static constexpr int kTilesPerSync = stream::kTilesPerSync;
  static constexpr int kFillStages = 1;
  using Raw = float[S::kBlocks][8];
  using X = AffineX<S, PPS>;
  AffineMeta meta;
  __device__ explicit AffineTiles(const DevMatrix& m) : meta(m) {}

  __device__ static void load_raw(const float* row, bool vec, int warp, int q, Raw& v) {
    const float* p = row == nullptr ? nullptr : row + warp * S::kSlice;
    if (vec) {
      X::template load_raw<true>(p, q, v);
    } else {
      X::template load_raw<false>(p, q, v);
    }
  }
  __device__ static void make(const Raw& v, int q, X& x) { x.make(v, q); }
  template <typename T>
  __device__ void fill_as(const Ring<S>& ring, int f, int lane, const Half& h0, const Half& h1) const {
    ring.begin_fill(f, lane, kTile * T::kCodeBytes + 4 * 8 * meta.row_bytes);
    const Half& h = lane < 8 ? h0 : h1;
    if (lane < kTile) {
      ring.copy(f, lane * T::kRowBytes,
                expert_bytes(h.m->data, h.m->data_stride, h.e) + (h.n0 + (lane & 7)) * T::kCodeBytes,
                T::kCodeBytes);
    }
    for (int i = 0; i < 2; ++i) {
      const Half& hm = i == 0 ? h0 : h1;
      copy_meta<T>(ring, f, lane, kTile + 2 * i, expert_bytes(hm.m->scales, hm.m->scale_stride, hm.e),
                   expert_bytes(hm.m->biases, hm.m->scale_stride, hm.e), meta.row_bytes, hm.n0, 8 * i, 8);
    }
  }
  __device__ void fill(const Ring<S>& ring, int* f, int lane, bool shared, const Half& h0,
                       const Half& h1) const {
    if (BITS != SHARED_BITS && shared) {
      fill_as<SS>(ring, *f, lane, h0, h1);
    } else {
      fill_as<SR>(ring, *f, lane, h0, h1);
    }
    ++*f;
  }
  __device__ void consume(const Ring<S>& ring, int* f, bool shared, int warp, int lane, const X& x,
                          float acc[4]) const {
    ring.wait_full(*f);
    if (BITS != SHARED_BITS && shared) {
      affine_product<SS, PPS>(ring.stage(*f), warp, lane, meta, x, acc);
    } else {
      affine_product<SR, PPS>(ring.stage(*f), warp, lane, meta, x, acc);
    }
    ring.release(*f, lane);
    ++*f;
  }
};

// The launch of a stream kernel of tiles W (its caller, in the kernel's own file, runs PD_TRACE_ENSURE: a
// trace build's buffer is per file).
template <typename W>
void launch_kernel(void (*kernel)(MoeStreamArgs), const MoeStreamArgs& a, int blocks, cudaStream_t stream) {
  static const int per = env_switch_on("PD_STREAM_PAIRS") ? kTilesPerSync : 1;
  static const bool evict_first = env_switch_on("PD_L2_EVICT_FIRST");
  MoeStreamArgs b = a;
  b.tiles_per_sync = per;
  b.evict_first = evict_first ? 1 : 0;
  launch_pdl(kernel, dim3(blocks), dim3(kThreads), W::S::kSmemBytes, stream, b);
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<AffineTiles<...>>) for routed experts of BITS bits and a shared expert of shared_bits: the
// same width, or the oq6e pair (routed 6, shared 8).
template <int KB, int BITS, int PPS, typename F>
void with_shared_width(int shared_bits, F&& f) {
  if constexpr (BITS == kMixedRoutedBits) {
    if (shared_bits == kMixedSharedBits) {
      f(TypeTag<AffineTiles<KB, BITS, PPS, kMixedSharedBits>>{});
      return;
    }
  }
  f(TypeTag<AffineTiles<KB, BITS, PPS>>{});
}

}  // namespace pd::cuda::moe_tiles
