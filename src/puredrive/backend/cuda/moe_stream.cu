// The experts of a decode MoE block (1..kMaxRows rows) on the weight stream of stream_ring.cuh, for bf16 or
// affine 4-, 6- or 8-bit experts (Bf16Tiles, AffineTiles: how a tile is copied and multiplied): the router +
// gate/up kernel and the down + combine kernel.
//
// Why: the CUDA-core expert kernels reach 1.6-2.5 TB/s; an expert's 2-4 MB are too few bytes for warps
// that wait on their own loads, and a verify step's rows cost them per-row work. Here each SM's producer
// warp streams tiles of 16 weight rows and the tensor cores serve all rows at once.
//
// Gate/up: a tile is 8 gate rows and the same 8 up rows of one expert (A rows 0-7 and 8-15), so one thread
// gets both sums of an output. Tiles are numbered shared expert first, then the used experts in ascending
// id; block b takes tiles b, b + G, ...; the shared expert's tiles are streamed before the route is known.
// act = silu(gate) * up is written for the rows that selected the expert.
//
// The route comes from the same kernel, while the producer streams the shared expert: the consumer warps
// compute the router and shared-gate outputs (moe_route.cuh, one warp per output, spread over the blocks),
// the blocks meet at a grid barrier (one block per SM: every block of the grid is resident), and each block
// then routes every row itself and hands the used experts to its producer. A separate router kernel cost
// 11 us per layer (ncu, serialised): its latency chain plus a launch, before the experts could start.
//
// Down + combine: block b owns the hidden outputs of column tiles b, b + G, ... and streams, per column
// tile, the shared expert's 16 rows and then each used expert's in ascending id (the shared expert's
// first tile before the route is known). The thread of output (n, r) keeps y_shared and accumulates
// ((0 + w_1 y_1) + w_2 y_2) + ... over the experts row r selected, in ascending id, then adds
// sigmoid(sg) * y_shared: the CPU backend's order. The next expert's activations are loaded while the
// current one is multiplied. Affine experts take down_split_items, whose two halves of the consumer
// warps take alternate experts (8-bit decode +4%, bench/results/2026-12-04-h200-c3e5e57.md).
//
// Measured and dropped (H200, exploratory builds, ncu times of the down kernel): each warp accumulating
// its weighted partials with one cross-warp sum per column tile, on a ring of 11 stages (11.9 -> 12.8 us at
// one row); the producer copying each expert's activations into its stage, reading the route from a table
// the consumers build (12.5 us at one row, 32.5 us at three rows); one 16 KB copy per tile instead of 16
// row copies (no change); rings of 64 or 96 KB for every stream kernel (bf16 decode 307 -> 292 tok/s).
//
// Row-exact: each product is the tensor-core product of gemv_stream.cu (a result depends on its weight
// row, its activation row and the width only), and the combine of an output reads that row's values only.
#include "puredrive/backend/cuda/moe_stream.h"

#include "puredrive/backend/cuda/moe_route.cuh"
#include "puredrive/backend/cuda/stream_affine.cuh"
#include "puredrive/backend/cuda/trace.cuh"

namespace pd::cuda {
namespace {

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
__device__ void build_slots(const MoeStreamArgs& a, const int* sel, const float* wts, const int* used,
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

// A block's copy of the route.
struct Route {
  int sel[kMaxRows * kStreamTopK];
  float wts[kMaxRows * kStreamTopK];
  int used[kMaxSlots];
  int count;
  uint32_t bits[kMaxExpertWords];
  int before[kMaxExpertWords];
  // The used experts of a step of `rows` rows: one row's selection is already the list (distinct, sorted by
  // id), so steps of one row build none.
  __device__ const int* used_list(int rows) const { return rows == 1 ? sel : used; }
  __device__ int used_count(int rows, int top_k) const { return rows == 1 ? top_k : count; }
};

// Every block of the grid (all resident) waits here until all have arrived; called by one thread per block.
// bar[0] counts arrivals and bar[1] the barriers passed: the last block to arrive resets the count, then
// advances the generation the others wait on.
__device__ void grid_barrier(int* bar) {
  volatile int* gen = bar + 1;
  const int g0 = *gen;
  __threadfence();
  if (atomicAdd(bar, 1) == static_cast<int>(gridDim.x) - 1) {
    bar[0] = 0;
    __threadfence();
    atomicAdd(bar + 1, 1);
  } else {
    while (*gen == g0) __nanosleep(64);
  }
  __threadfence();
}

// The consumer warps of every block: router outputs (warp w of block b computes output b + G w). RF: the
// router's format, the experts' (affine routers are 8-bit); its activation loads are scalar, so the kernel
// needs no variant for unaligned rows.
template <int RF>
__device__ __forceinline__ void router_outputs(const MoeStreamArgs& a, int warp, int lane) {
  const MoeLaunch& m = a.m;
  const int64_t n = blockIdx.x + static_cast<int64_t>(gridDim.x) * warp;
  if (n <= m.experts) {
    constexpr int kBits = RF == static_cast<int>(WFmt::kAffine) ? 8 : 0;
    // Accumulators for the rows there are (a row's sum does not depend on how many: dot_rows).
    if (a.rows == 1) {
      router_output<RF, kBits, false, 1>(m, n, a.x, a.xs, a.rows, lane, a.logits, a.sg);
    } else if (a.rows <= 4) {
      router_output<RF, kBits, false, 4>(m, n, a.x, a.xs, a.rows, lane, a.logits, a.sg);
    } else {
      router_output<RF, kBits, false, kMaxRows>(m, n, a.x, a.xs, a.rows, lane, a.logits, a.sg);
    }
  }
}

// Row r of the step into the route (warp-wide), once every router output of the grid is written.
__device__ __forceinline__ void route_one_row(const MoeStreamArgs& a, int r, Route* rt) {
  const MoeLaunch& m = a.m;
  route_row(a.logits + static_cast<int64_t>(r) * m.experts, m.experts, m.top_k, m.norm_topk,
            rt->sel + r * m.top_k, rt->wts + r * m.top_k);
}

// Every row routed: the used experts (Route::used_list), and block 0 writes the route for the down kernel
// (the consumers). A one-row step's producer starts the routed tiles without waiting for this.
__device__ __forceinline__ void publish_route(const MoeStreamArgs& a, Route* rt) {
  const MoeLaunch& m = a.m;
  const int K = m.top_k;
  if (a.rows > 1) {
    list_used_experts(rt->sel, a.rows * K, m.experts, kConsumers * 32, rt->bits, rt->before, rt->used,
                      &rt->count, [] { consumers_sync(); });
  }
  if (threadIdx.x == 0) PD_TRACE_CLK(4);
  if (blockIdx.x == 0) {
    const int* used = rt->used_list(a.rows);
    const int count = rt->used_count(a.rows, K);
    for (int i = static_cast<int>(threadIdx.x); i < a.rows * K; i += kConsumers * 32) {
      a.sel[i] = rt->sel[i];
      a.wts[i] = rt->wts[i];
    }
    for (int i = static_cast<int>(threadIdx.x); i < count; i += kConsumers * 32) a.used[i] = used[i];
    if (threadIdx.x == 0) {
      *a.count = count;
      if (m.experts_read != nullptr) atomicAdd(m.experts_read, static_cast<unsigned long long>(count));
    }
  }
}

// Named barriers of the gate/up kernel besides consumers_sync (1): the used list is ready for the producer
// (2, steps of several rows: the consumers arrive, the producer waits); the block's router outputs are
// written (3: the consumers arrive, the producer waits); the grid barrier is passed (4: the producer arrives,
// the warps that route rows 1.. wait); row 0 is routed (5: the producer arrives, the consumers wait).
enum RouteBarrier { kRouteReady = 2, kRouterOutputs = 3, kGridPassed = 4, kRowZeroRouted = 5 };
template <int ID>
__device__ __forceinline__ void named_arrive(int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"n"(ID), "r"(threads) : "memory");
}
template <int ID>
__device__ __forceinline__ void named_sync(int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"n"(ID), "r"(threads) : "memory");
}

// The route's code runs once per launch, straight-line, and was measured cold in the instruction cache
// (the bf16 kernel is 176 KB of code, and five other kernels run between two gate/up launches): routing zero
// logits while the kernel waits for the previous one cut the route from 6.3 to 3.8 us per layer (trace
// build, bf16; then a spare consumer warp, now the producer warp, which routes row 0). route_row is out of
// line so that both calls run the same code. The results are discarded.
__device__ const float kZeroLogits[1024] = {};
__device__ __forceinline__ void warm_route_code(const MoeLaunch& m) {
  __shared__ int sel[kStreamTopK];
  __shared__ float wts[kStreamTopK];
  route_row(kZeroLogits, m.experts, m.top_k, m.norm_topk, sel, wts);
}

// The affine router's products need more registers than the experts' loop: out of line, so that their
// spills stay in the router (measured: spills in every affine gate/up kernel when inline).
template <int RF>
__device__ __noinline__ void router_outputs_out_of_line(const MoeStreamArgs& a, int warp, int lane) {
  router_outputs<RF>(a, warp, lane);
}

// The consumers tell the producer that *rt holds the route.
__device__ __forceinline__ void route_ready_arrive() {
  named_arrive<kRouteReady>(kThreads);
}
__device__ __forceinline__ void route_ready_wait() {
  named_sync<kRouteReady>(kThreads);
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

__device__ __forceinline__ bool aligned_rows(const float* x, int64_t xs) {
  return reinterpret_cast<uintptr_t>(x) % 16 == 0 && xs % 4 == 0;
}

// This block's share of `bytes` bytes at p (both multiples of 16) into L2 (prefetch_l2), the grid's blocks
// taking consecutive pieces.
__device__ __forceinline__ void prefetch_share(const void* p, int64_t bytes) {
  const int64_t share = ((bytes + gridDim.x - 1) / gridDim.x + 15) / 16 * 16;
  const int64_t off = blockIdx.x * share;
  if (off < bytes) {
    prefetch_l2(static_cast<const uint8_t*>(p) + off,
                static_cast<uint32_t>(share < bytes - off ? share : bytes - off));
  }
}

// Part `part` of expert e of m (0: its weights or codes; 1, 2: the scales and biases of affine weights, else
// nothing): its bytes, and where they start.
__device__ __forceinline__ int64_t matrix_part(const DevMatrix& m, int e, int part, const uint8_t** at) {
  const bool affine = m.fmt == WFmt::kAffine;
  if (part > 0 && !affine) return 0;
  const void* base = part == 0 ? m.data : part == 1 ? m.scales : m.biases;
  *at = expert_bytes(base, part == 0 ? m.data_stride : m.scale_stride, e);
  return part == 0 ? m.rows * m.cols * (affine ? m.bits : 16) / 8 : m.rows * meta_row_bytes(m);
}

// Block b's share of the down weights the down kernel will read (the shared expert's and the used experts':
// codes, and for affine weights scales and biases), into L2 by the producer warp once it has issued its last
// copy. The gate/up kernel leaves the DRAM idle for much of its time (its router, the grid barrier and the
// route come first; ncu: about 1.5 TB/s), and the down kernel starts when it ends (bf16 +1.8%, 8-bit +3.9%,
// bench/results/2026-12-03-h200-1132a5d.md). Issued as soon as the route was known, the prefetch slowed the
// kernel's own copies (26.6 -> 29.8 us under ncu) and gained less.
__device__ void prefetch_down(const MoeStreamArgs& a, const int* used, int count, int lane) {
  for (int i = lane; i < 3 * (count + 1); i += 32) {
    const int item = i / 3;  // 0: the shared expert, else used[item - 1]
    const uint8_t* at = nullptr;
    const int64_t bytes =
        matrix_part(item == 0 ? a.m.sh_down : a.m.down, item == 0 ? 0 : used[item - 1], i % 3, &at);
    if (bytes > 0) prefetch_share(at, bytes);
  }
}

// Gate/up tiles: t < shared_tiles is the shared expert's tile t, else used expert (t - shared_tiles) / tiles
// at tile (t - shared_tiles) % tiles; tiles of 8 intermediate rows.
struct UpTile {
  int u;  // used-expert index, -1 for the shared expert
  int n0;
};
__device__ __forceinline__ UpTile up_tile(int64_t t, int shared_tiles, int tiles) {
  if (t < shared_tiles) return {-1, static_cast<int>(t) * 8};
  const int64_t rt = t - shared_tiles;
  return {static_cast<int>(rt / tiles), static_cast<int>(rt % tiles) * 8};
}

template <typename W>
__global__ void __launch_bounds__(kThreads, 1) moe_up_stream_kernel(const __grid_constant__ MoeStreamArgs a) {
  using S = typename W::S;
  PD_TRACE_SCOPE(kMoeUp, a.rows);
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ SlotTable table;
  __shared__ Route route;
  const Ring<S> ring(smem, a.evict_first != 0);
  const MoeLaunch& m = a.m;
  const W tiles_of(m.gate);
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int shared_tiles = m.shared_inter / 8, tiles = m.inter / 8;
  const int64_t G = gridDim.x;
  PD_TRACE_CLEAR();
  if (threadIdx.x == 0) ring.init();
  __syncthreads();
  pdl_launch_dependents();

  if (warp == kConsumers) {
    int f = 0;
    auto fill = [&](int64_t t) {
      const UpTile tile = up_tile(t, shared_tiles, tiles);
      const bool shared = tile.u < 0;
      const int e = shared ? 0 : route.used_list(a.rows)[tile.u];
      tiles_of.fill(ring, &f, lane, shared, Half{shared ? &m.sh_gate : &m.gate, e, tile.n0},
                    Half{shared ? &m.sh_up : &m.up, e, tile.n0});
    };
    // Before the route is known, the shared expert's tiles that the ring takes without waiting for the
    // consumers (they wait for this warp's route).
    int64_t t = blockIdx.x;
    for (; t < shared_tiles && f + W::kFillStages <= S::kStages; t += G) fill(t);
    // This warp routes row 0: it holds no activations, so the consumers make theirs meanwhile (made after
    // the route, they had cost about 4 us per layer; made before it in the consumers, they lived across
    // the route's call and ptxas spilled them inside the tile loop).
    if (a.warm_route != 0) warm_route_code(m);
    named_sync<kRouterOutputs>(kThreads);
    if (lane == 0) {
      grid_barrier(m.router_ticket);
      PD_TRACE_CLK(2);
    }
    __syncwarp();
    if (a.rows > 1) named_arrive<kGridPassed>(32 * a.rows);
    route_one_row(a, 0, &route);
    named_arrive<kRowZeroRouted>(kThreads);
    if (a.rows == 1) {
      __syncwarp();  // the route's lanes wrote route.sel, the used list
    } else {
      route_ready_wait();
    }
    const int used_count = route.used_count(a.rows, m.top_k);
    const int64_t total = shared_tiles + static_cast<int64_t>(used_count) * tiles;
    for (; t < total; t += G) fill(t);
    if (a.prefetch_down != 0) prefetch_down(a, route.used_list(a.rows), used_count, lane);
    return;
  }

  const int64_t router_row = blockIdx.x + G * warp;
  if (router_row <= m.experts) {
    const DevMatrix& w = router_row < m.experts ? m.router : m.shared_gate;
    prefetch_row_l2(w, w.data, router_row < m.experts ? router_row : 0, lane);
  }
  pdl_wait();
  PD_TRACE_STAMP(0);
  if constexpr (W::kRouterFmt == static_cast<int>(WFmt::kAffine)) {
    router_outputs_out_of_line<W::kRouterFmt>(a, warp, lane);
  } else {
    router_outputs<W::kRouterFmt>(a, warp, lane);
  }
  if (threadIdx.x == 0) PD_TRACE_CLK(1);
  named_arrive<kRouterOutputs>(kThreads);
  const int g = lane >> 2, q = lane & 3;
  typename W::X x;
  if (warp >= 1 && warp < a.rows) {  // rows 1..: each routed by its warp, which makes its fragments after
    named_sync<kGridPassed>(32 * a.rows);
    route_one_row(a, warp, &route);
  }
  {
    typename W::Raw v;
    W::load_raw(g < a.rows ? a.x + g * a.xs : nullptr, aligned_rows(a.x, a.xs), warp, q, v);
    W::make(v, q, x);
  }
  PD_TRACE_STAMP(7);
  named_sync<kRowZeroRouted>(kThreads);
  if (threadIdx.x == 0) PD_TRACE_CLK(3);
  publish_route(a, &route);
  PD_TRACE_STAMP(5);
  if (a.rows > 1) route_ready_arrive();
  const int count = route.used_count(a.rows, m.top_k);
  build_slots(a, route.sel, route.wts, route.used_list(a.rows), count, &table);
  PD_TRACE_STAMP(6);
  const int64_t total = shared_tiles + static_cast<int64_t>(count) * tiles;
  // act of tile t's 8 outputs for every row, from partial slot `slot`, by the 64 threads id.
  auto finish = [&](int64_t t, int slot_of_tile, int id) {
    const int off = id >> 3, r = id & 7;
    const UpTile tile = up_tile(t, shared_tiles, tiles);
    const float gs = tile_output(ring.part, slot_of_tile, off, r),
                us = tile_output(ring.part, slot_of_tile, off + 8, r);
    const float v = siluf_(gs) * us;
    if (tile.u < 0) {
      if (r < a.rows) a.sact[r * m.shared_inter + tile.n0 + off] = v;
    } else {
      const int slot = table.slot[tile.u][r];
      if (slot >= 0) a.act[(static_cast<int64_t>(r) * m.top_k + slot) * m.inter + tile.n0 + off] = v;
    }
  };
  int f = 0;
  int buf = 0;
  if constexpr (W::kTilesPerSync == 1) {
    for (int64_t t = blockIdx.x; t < total; t += G) {
      float acc[4] = {};
      tiles_of.consume(ring, &f, t < shared_tiles, warp, lane, x, acc);
      publish(ring.part, buf, warp, lane, acc);
      if (threadIdx.x < 64) finish(t, buf, static_cast<int>(threadIdx.x));
      buf ^= 1;
      if (t == blockIdx.x) PD_TRACE_STAMP(8);
      if (t == blockIdx.x + G) PD_TRACE_STAMP(9);
    }
  } else {
    // a.tiles_per_sync (<= W::kTilesPerSync) tiles t0, t0 + G, ... per exchange of the partials, tile k
    // finished by threads [64 k, 64 k + 64).
    constexpr int kPer = W::kTilesPerSync;
    const int per = a.tiles_per_sync;
    for (int64_t t0 = blockIdx.x; t0 < total; t0 += per * G, buf ^= 1) {
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int64_t t = t0 + k * G;
        if (k < per && t < total) {
          float acc[4] = {};
          tiles_of.consume(ring, &f, t < shared_tiles, warp, lane, x, acc);
          stash(ring.part, buf * kPer + k, warp, lane, acc);
        }
      }
      consumers_sync();
      const int k = static_cast<int>(threadIdx.x >> 6);
      if (k < per && t0 + k * G < total)
        finish(t0 + k * G, buf * kPer + k, static_cast<int>(threadIdx.x & 63));
      if (t0 == blockIdx.x) PD_TRACE_STAMP(8);  // the first exchange
      if (t0 == blockIdx.x + per * G) PD_TRACE_STAMP(9);
    }
  }
  PD_TRACE_STAMP(10);
  for (int i = 1; i <= 4; ++i) PD_TRACE_ADOPT(i);
}

// The activations of expert item j of the down kernel (j = 0: the shared expert, else used expert j - 1) for
// row g: null for rows that did not select the expert.
__device__ __forceinline__ const float* act_row(const MoeStreamArgs& a, const SlotTable& table, int j,
                                                int g) {
  if (g >= a.rows) return nullptr;
  if (j == 0) return a.sact + static_cast<int64_t>(g) * a.m.shared_inter;
  const int slot = table.slot[j - 1][g];
  return slot < 0 ? nullptr : a.act + (static_cast<int64_t>(g) * a.m.top_k + slot) * a.m.inter;
}

// Producer warp of the down kernels: per column tile nt of this block, the shared expert's 16 rows (the
// first tile's before the route is known), then each used expert's in ascending id.
template <typename W>
__device__ void fill_down_tiles(const MoeStreamArgs& a, const W& tiles_of, const Ring<typename W::S>& ring,
                                int lane) {
  const MoeLaunch& m = a.m;
  int f = 0;
  auto fill = [&](int nt, int j) {
    const DevMatrix* w = j == 0 ? &m.sh_down : &m.down;
    const int e = j == 0 ? 0 : a.used[j - 1];
    tiles_of.fill(ring, &f, lane, j == 0, Half{w, e, static_cast<int64_t>(nt) * kTile},
                  Half{w, e, static_cast<int64_t>(nt) * kTile + 8});
  };
  fill(static_cast<int>(blockIdx.x), 0);
  pdl_wait();
  const int count = *a.count;
  for (int nt = static_cast<int>(blockIdx.x); nt < m.hidden / kTile; nt += static_cast<int>(gridDim.x)) {
    for (int j = nt == static_cast<int>(blockIdx.x) ? 1 : 0; j <= count; ++j) fill(nt, j);
  }
}

// Expert item j's output y for step row r into the combine: the shared expert's (j = 0) kept apart, a
// routed expert's weighted in if row r selected it (called in ascending j: the CPU backend's order).
__device__ __forceinline__ void add_item(const SlotTable& table, int j, int r, float y, float* acc,
                                         float* ys) {
  if (j == 0) {
    *ys = y;
  } else if (table.slot[j - 1][r] >= 0) {
    *acc = *acc + y * table.wt[j - 1][r];
  }
}

// Output (column tile nt, row off) of step row r: the routed experts' sum plus the gated shared expert.
__device__ __forceinline__ void store_down(const MoeStreamArgs& a, int nt, int off, int r, float acc,
                                           float ys) {
  const float out = acc + sigmoidf_(a.sg[r]) * ys;
  float* o = a.m.out + r * a.m.out_stride + static_cast<int64_t>(nt) * kTile + off;
  *o = a.m.accumulate ? *o + out : out;
}

// Consumer warps of the down kernel: every warp takes 32 columns of every expert item, in ascending order.
template <typename W>
__device__ void down_every_item(const MoeStreamArgs& a, const SlotTable& table, const W& tiles_of,
                                const Ring<typename W::S>& ring, int count, int warp, int lane) {
  const int col_tiles = a.m.hidden / kTile;
  const int G = static_cast<int>(gridDim.x);
  const int g = lane >> 2, q = lane & 3;
  const int off = static_cast<int>(threadIdx.x >> 3), r = static_cast<int>(threadIdx.x & 7);
  const bool owner = threadIdx.x < kTile * 8;  // of output (column tile row off, step row r)
  typename W::Raw v;
  // a.tiles_per_sync (<= W::kTilesPerSync) experts per exchange of the partials, combined in ascending order.
  constexpr int kPer = W::kTilesPerSync;
  const int per = kPer == 1 ? 1 : a.tiles_per_sync;
  int f = 0, buf = 0;
  for (int nt = static_cast<int>(blockIdx.x); nt < col_tiles; nt += G) {
    float acc = 0.0f, ys = 0.0f;
    // Expert j's fragments (x) are made while expert j - 1's product runs, and its raw values loaded one
    // expert earlier still: each warp's experts are a chain of dependent steps (an 8-bit expert's fixed-point
    // split is about as many instructions as its product), which this overlaps.
    typename W::X x;
    W::load_raw(act_row(a, table, 0, g), true, warp, q, v);
    W::make(v, q, x);
    if (count > 0) W::load_raw(act_row(a, table, 1, g), true, warp, q, v);
    for (int j0 = 0; j0 <= count; j0 += per, buf ^= 1) {
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int j = j0 + k;
        if (k >= per || j > count) break;
        typename W::X next;
        if (j < count) {
          W::make(v, q, next);
          if (j + 1 < count) W::load_raw(act_row(a, table, j + 2, g), true, warp, q, v);
        }
        float part[4] = {};
        tiles_of.consume(ring, &f, j == 0, warp, lane, x, part);
        stash(ring.part, buf * kPer + k, warp, lane, part);
        if (j < count) x = next;
      }
      consumers_sync();
      if (owner) {
        for (int k = 0; k < per && j0 + k <= count; ++k) {
          const int j = j0 + k;
          add_item(table, j, r, tile_output(ring.part, buf * kPer + k, off, r), &acc, &ys);
        }
      }
    }
    if (owner && r < a.rows) store_down(a, nt, off, r, acc, ys);
  }
}

// A 512-column affine row over 8 consumer warps of 64 columns each (the split down kernel), where
// AffineShape<1, BITS> gives each of 16 warps 32 columns.
template <int BITS>
struct SplitShape : AffineShape<1, BITS> {
  static constexpr int kSlice = 64;
  static constexpr int kBlocks = 2;
};

// Down + combine of affine experts with the expert items split between the two halves of the consumer
// warps: warp w multiplies columns [64 (w % 8), + 64) of items j = w / 8, w / 8 + 2, ..., so each exchange
// of the partials serves two items at once and each warp's chain of experts (the activations' fixed-point
// split, the integer products, the fold) is half as long as in down_every_item, where every warp
// takes 32 columns of every item. The same tiles and ring; every warp releases both stages of a pair, so a
// stage's empty barrier still counts 16 arrivals, 8 of them after the reads. An item's output is its 8
// warps' partials summed in warp order, then combined in ascending order as there; the fixed-point scale
// is per row and 64 columns, so a result depends on its row alone.
template <typename W, int PPS>
__device__ void down_split_items(const MoeStreamArgs& a, const SlotTable& table,
                                 const Ring<typename W::S>& ring, int count, int warp, int lane) {
  using TR = SplitShape<W::SR::kBits>;
  using TS = SplitShape<W::SS::kBits>;
  using X = AffineX<TR, PPS>;  // TR and TS have the same slices
  const int col_tiles = a.m.hidden / kTile;
  const int G = static_cast<int>(gridDim.x);
  const int g = lane >> 2, q = lane & 3;
  const int slice = warp & 7, half = warp >> 3;
  const int off = static_cast<int>(threadIdx.x >> 3), r = static_cast<int>(threadIdx.x & 7);
  const bool owner = threadIdx.x < kTile * 8;  // of output (column tile row off, step row r)
  const AffineMeta meta(a.m.down);
  auto load = [&](int j, float(&v)[TR::kBlocks][8]) {
    const float* row = act_row(a, table, j, g);
    X::template load_raw<true>(row == nullptr ? nullptr : row + slice * TR::kSlice, q, v);
  };
  int f0 = 0, buf = 0;
  for (int nt = static_cast<int>(blockIdx.x); nt < col_tiles; nt += G, f0 += count + 1) {
    float acc = 0.0f, ys = 0.0f;
    // This warp's items j = half, half + 2, ...: item j + 2's fragments are made while item j's product
    // runs, and its raw values loaded one item earlier still.
    float v[TR::kBlocks][8];
    X x;
    load(half, v);
    x.make(v, q);
    if (half + 2 <= count) load(half + 2, v);
    for (int j0 = 0; j0 <= count; j0 += 2, buf ^= 1) {
      const int j = j0 + half;
      float part[4] = {};
      if (j <= count) {
        X next;
        if (j + 2 <= count) {
          next.make(v, q);
          if (j + 4 <= count) load(j + 4, v);
        }
        ring.wait_full(f0 + j);
        if (TR::kBits != TS::kBits && j == 0) {
          affine_product<TS, PPS>(ring.stage(f0 + j), slice, lane, meta, x, part);
        } else {
          affine_product<TR, PPS>(ring.stage(f0 + j), slice, lane, meta, x, part);
        }
        if (j + 2 <= count) x = next;
      }
      ring.release(f0 + j0, lane);
      if (j0 + 1 <= count) ring.release(f0 + j0 + 1, lane);
      stash(ring.part, buf * 2 + half, slice, lane, part);
      consumers_sync();
      if (owner) {
        for (int k = 0; k < 2 && j0 + k <= count; ++k) {
          const int jj = j0 + k;
          add_item(table, jj, r, tile_output<8>(ring.part, buf * 2 + k, off, r), &acc, &ys);
        }
      }
    }
    if (owner && r < a.rows) store_down(a, nt, off, r, acc, ys);
  }
}

// Down + combine, intermediate size 512: W's shape of KB = 1 (one tile per stage). SPLIT_PPS: 0, every warp
// takes every expert item (down_every_item); else the affine split kernel with that many group pieces per
// 64-column slice (down_split_items).
template <typename W, int SPLIT_PPS = 0>
__global__ void __launch_bounds__(kThreads, 1)
    moe_down_stream_kernel(const __grid_constant__ MoeStreamArgs a) {
  using S = typename W::S;
  static_assert(S::kCols == 512, "down products of one 512-column row");
  PD_TRACE_SCOPE(kMoeDown, a.rows);
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ SlotTable table;
  const Ring<S> ring(smem, a.evict_first != 0);
  const W tiles_of(a.m.down);
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  if (threadIdx.x == 0) ring.init();
  __syncthreads();
  pdl_launch_dependents();

  if (warp == kConsumers) {
    fill_down_tiles(a, tiles_of, ring, lane);
    return;
  }

  pdl_wait();
  PD_TRACE_STAMP(0);
  const int count = *a.count;
  build_slots(a, a.sel, a.wts, a.used, count, &table);
  PD_TRACE_STAMP(1);
  if constexpr (SPLIT_PPS == 0) {
    down_every_item(a, table, tiles_of, ring, count, warp, lane);
  } else {
    down_split_items<W, SPLIT_PPS>(a, table, ring, count, warp, lane);
  }
}

template <typename W>
void launch_kernel(void (*kernel)(MoeStreamArgs), const MoeStreamArgs& a, int blocks, cudaStream_t stream) {
  PD_TRACE_ENSURE();
  static const int per = env_switch_on("PD_STREAM_PAIRS") ? kTilesPerSync : 1;
  static const bool evict_first = env_switch_on("PD_L2_EVICT_FIRST");
  MoeStreamArgs b = a;
  b.tiles_per_sync = per;
  b.evict_first = evict_first ? 1 : 0;
  launch_pdl(kernel, dim3(blocks), dim3(kThreads), W::S::kSmemBytes, stream, b);
}

template <typename W>
void launch_up(const MoeStreamArgs& a, cudaStream_t stream) {
  static const int sms = prepare_kernel<typename W::S>(moe_up_stream_kernel<W>);
  static const bool warm = env_switch_on("PD_WARM_ROUTE");
  static const bool prefetch = env_switch_on("PD_MOE_PREFETCH");
  MoeStreamArgs b = a;
  b.warm_route = warm ? 1 : 0;
  b.prefetch_down = prefetch ? 1 : 0;
  launch_kernel<W>(moe_up_stream_kernel<W>, b, sms, stream);
}

template <typename W, int SPLIT_PPS = 0>
void launch_down(const MoeStreamArgs& a, cudaStream_t stream) {
  static const int sms = prepare_kernel<typename W::S>(moe_down_stream_kernel<W, SPLIT_PPS>);
  const int col_tiles = a.m.hidden / kTile;
  launch_kernel<W>(moe_down_stream_kernel<W, SPLIT_PPS>, a, col_tiles < sms ? col_tiles : sms, stream);
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

template <int KB>
void launch_up_kb(const MoeStreamArgs& a, cudaStream_t stream) {
  if (a.m.gate.fmt == WFmt::kBF16) {
    launch_up<Bf16Tiles<KB>>(a, stream);
    return;
  }
  with_stream_bits(a.m.gate.bits, [&](auto bits) {
    constexpr int kBits = decltype(bits)::value;
    with_pieces<AffineShape<KB, kBits>>(a.m.gate.group_size, [&](auto pps) {
      with_shared_width<KB, kBits, decltype(pps)::value>(
          a.m.sh_gate.bits, [&](auto tiles) { launch_up<typename decltype(tiles)::type>(a, stream); });
    });
  });
}

// Every expert matrix in one format the stream takes (bf16, or affine of one group size and scale dtype with
// stream_affine.cuh's layout, the routed experts of one width and the shared expert of the same or, as in the
// oq6e recipe, 8 bits against 6), 16-byte aligned experts.
bool stream_format(const MoeLaunch& m) {
  const bool widths = m.sh_gate.bits == m.gate.bits ||
                      (m.gate.bits == kMixedRoutedBits && m.sh_gate.bits == kMixedSharedBits);
  if (m.gate.fmt == WFmt::kAffine && !widths) return false;
  const DevMatrix* all[] = {&m.gate, &m.up, &m.down, &m.sh_gate, &m.sh_up, &m.sh_down};
  for (const DevMatrix* w : all) {
    const int bits = w == &m.sh_gate || w == &m.sh_up || w == &m.sh_down ? m.sh_gate.bits : m.gate.bits;
    const bool same = w->fmt == m.gate.fmt &&
                      (w->fmt != WFmt::kAffine || (w->bits == bits && w->group_size == m.gate.group_size &&
                                                   w->scale_dtype == m.gate.scale_dtype));
    const bool format = w->fmt == WFmt::kBF16 || affine_stream_layout(*w);
    const bool aligned = reinterpret_cast<uintptr_t>(w->data) % 16 == 0 && w->data_stride % 16 == 0 &&
                         (w->fmt != WFmt::kAffine || w->scale_stride % 16 == 0);
    if (!same || !format || !aligned) return false;
  }
  return true;
}

}  // namespace

bool moe_stream_supported(const MoeLaunch& m) {
  static const bool enabled = env_switch_on("PD_MOE_STREAM");
  const int64_t H = m.hidden, I = m.inter;
  // The router in the experts' format (the kernels' RF): bf16, or affine 8-bit of any group size (whatever
  // the experts' width: the quantization recipes keep routers at 8 bits).
  const bool router = m.router.fmt == m.gate.fmt && (m.router.fmt != WFmt::kAffine || m.router.bits == 8);
  return enabled && m.router_gate_fused && router && m.top_k <= kStreamTopK && m.shared_inter == I &&
         (H == 512 || H == 1024 || H == 2048 || H == 4096) && I == 512 && stream_format(m) &&
         m.gate.cols == H && m.up.cols == H && m.sh_gate.cols == H && m.sh_up.cols == H && m.down.cols == I &&
         m.sh_down.cols == I;
}

void launch_moe_stream_up(const MoeStreamArgs& a, cudaStream_t stream) {
  switch (a.m.hidden / 512) {
    case 1:
      launch_up_kb<1>(a, stream);
      return;
    case 2:
      launch_up_kb<2>(a, stream);
      return;
    case 4:
      launch_up_kb<4>(a, stream);
      return;
    default:
      launch_up_kb<8>(a, stream);
      return;
  }
}

void launch_moe_stream_down(const MoeStreamArgs& a, cudaStream_t stream) {
  if (a.m.down.fmt == WFmt::kBF16) {
    launch_down<Bf16Tiles<1>>(a, stream);
  } else {
    static const bool split = env_switch_on("PD_DOWN_SPLIT");
    with_stream_bits(a.m.down.bits, [&](auto bits) {
      constexpr int kBits = decltype(bits)::value;
      with_shared_width<1, kBits, 1>(a.m.sh_down.bits, [&](auto tiles) {
        using W = typename decltype(tiles)::type;
        if (!split) {
          launch_down<W>(a, stream);
          return;
        }
        with_pieces<SplitShape<kBits>>(a.m.down.group_size,
                                       [&](auto pps) { launch_down<W, decltype(pps)::value>(a, stream); });
      });
    });
  }
}

}  // namespace pd::cuda
