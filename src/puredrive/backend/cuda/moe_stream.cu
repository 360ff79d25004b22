// The experts of a decode MoE block (1..kMaxRows rows) on the weight stream of stream_ring.cuh, for bf16
// experts: the router + gate/up kernel and the down + combine kernel.
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
// current one is multiplied.
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

#include <cstdlib>

#include "puredrive/backend/cuda/moe_route.cuh"
#include "puredrive/backend/cuda/stream_ring.cuh"

namespace pd::cuda {
namespace {

using namespace stream;

constexpr int kStreamTopK = 16;                    // experts per row the slot table holds
constexpr int kMaxSlots = kMaxRows * kStreamTopK;  // used experts of one step

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

// The consumer warps of every block: router outputs (warp w of block b computes output b + G w), the grid
// barrier, then the block's own routing of every row into *rt. Block 0 also writes the route for the down
// kernel.
template <bool VEC>
__device__ void route_chunk(const MoeStreamArgs& a, int warp, int lane, Route* rt) {
  const MoeLaunch& m = a.m;
  const int E = m.experts, K = m.top_k;
  const int64_t n = blockIdx.x + static_cast<int64_t>(gridDim.x) * warp;
  if (n <= E) {
    router_output<static_cast<int>(WFmt::kBF16), 0, VEC, kMaxRows>(m, n, a.x, a.xs, a.rows, lane, a.logits,
                                                                   a.sg);
  }
  consumers_sync();
  if (threadIdx.x == 0) grid_barrier(m.router_ticket);
  consumers_sync();
  if (warp < a.rows)
    route_row(a.logits + static_cast<int64_t>(warp) * E, E, K, m.norm_topk, rt->sel + warp * K,
              rt->wts + warp * K);
  list_used_experts(rt->sel, a.rows * K, E, kConsumers * 32, rt->bits, rt->before, rt->used, &rt->count,
                    [] { consumers_sync(); });
  if (blockIdx.x == 0) {
    for (int i = static_cast<int>(threadIdx.x); i < a.rows * K; i += kConsumers * 32) {
      a.sel[i] = rt->sel[i];
      a.wts[i] = rt->wts[i];
    }
    for (int i = static_cast<int>(threadIdx.x); i < rt->count; i += kConsumers * 32) a.used[i] = rt->used[i];
    if (threadIdx.x == 0) {
      *a.count = rt->count;
      if (m.experts_read != nullptr) atomicAdd(m.experts_read, static_cast<unsigned long long>(rt->count));
    }
  }
}

// The consumers tell the producer that *rt holds the route (named barrier 2: arrive here, sync there).
__device__ __forceinline__ void route_ready_arrive() {
  asm volatile("bar.arrive 2, %0;\n" ::"n"(kThreads) : "memory");
}
__device__ __forceinline__ void route_ready_wait() {
  asm volatile("bar.sync 2, %0;\n" ::"n"(kThreads) : "memory");
}

__device__ __forceinline__ const uint16_t* expert_data(const DevMatrix& m, int e) {
  return reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(m.data) +
                                           static_cast<int64_t>(e) * m.data_stride);
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

template <int KB, bool VEC>
__global__ void __launch_bounds__(kThreads, 1) moe_up_stream_kernel(const __grid_constant__ MoeStreamArgs a) {
  using S = Shape<KB>;
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ SlotTable table;
  __shared__ Route route;
  const Ring<S> ring(smem);
  const MoeLaunch& m = a.m;
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int shared_tiles = m.shared_inter / 8, tiles = m.inter / 8;
  const int64_t G = gridDim.x;
  if (threadIdx.x == 0) ring.init();
  __syncthreads();
  pdl_launch_dependents();

  if (warp == kConsumers) {
    int f = 0;
    auto fill = [&](int64_t t) {
      const UpTile tile = up_tile(t, shared_tiles, tiles);
      const bool shared = tile.u < 0;
      const int e = shared ? 0 : route.used[tile.u];
      const DevMatrix& w = lane < 8 ? (shared ? m.sh_gate : m.gate) : (shared ? m.sh_up : m.up);
      const uint16_t* rows = expert_data(w, e) + static_cast<int64_t>(tile.n0 + (lane & 7)) * S::kCols;
      for (int c = 0; c < S::kChunks; ++c, ++f) {
        ring.begin_fill(f, lane);
        if (lane < kTile) ring.copy_row(f, lane, rows + c * S::kChunk);
      }
    };
    int64_t t = blockIdx.x;
    for (; t < shared_tiles; t += G) fill(t);  // before the route is known
    route_ready_wait();
    const int64_t total = shared_tiles + static_cast<int64_t>(route.count) * tiles;
    for (; t < total; t += G) fill(t);
    return;
  }

  const int64_t router_row = blockIdx.x + G * warp;
  if (router_row < m.experts) prefetch_row_l2(m.router, m.router.data, router_row, lane);
  pdl_wait();
  route_chunk<VEC>(a, warp, lane, &route);
  route_ready_arrive();
  const int count = route.count;
  build_slots(a, route.sel, route.wts, route.used, count, &table);
  const int g = lane >> 2, q = lane & 3;
  const bool has_row = g < a.rows;
  const float* xr = a.x + (has_row ? g : 0) * a.xs;
  uint32_t frag[S::kChunks][S::kBlocks32][8];
  load_fragments<S, VEC>(xr, has_row, warp, q, frag);
  const int col = column_bytes<S>(warp, q);
  const int64_t total = shared_tiles + static_cast<int64_t>(count) * tiles;
  int f = 0;
  int buf = 0;
  for (int64_t t = blockIdx.x; t < total; t += G) {
    float acc[4] = {};
    consume_tile(ring, &f, col, g, lane, frag, acc);
    publish(ring.part, buf, warp, lane, acc);
    if (threadIdx.x < 64) {
      const int off = static_cast<int>(threadIdx.x >> 3), r = static_cast<int>(threadIdx.x & 7);
      const UpTile tile = up_tile(t, shared_tiles, tiles);
      const float gs = tile_output(ring.part, buf, off, r), us = tile_output(ring.part, buf, off + 8, r);
      const float v = siluf_(gs) * us;
      if (tile.u < 0) {
        if (r < a.rows) a.sact[r * m.shared_inter + tile.n0 + off] = v;
      } else {
        const int slot = table.slot[tile.u][r];
        if (slot >= 0) a.act[(static_cast<int64_t>(r) * m.top_k + slot) * m.inter + tile.n0 + off] = v;
      }
    }
    buf ^= 1;
  }
}

using DownShape = Shape<1>;  // intermediate size 512: one chunk, 32 columns per consumer warp

// Lane (g, q)'s activations of expert item j of the down kernel (j = 0: the shared expert, else used
// expert j - 1): 8 columns of its slice, zero for rows that did not select the expert.
__device__ __forceinline__ void load_act(const MoeStreamArgs& a, const SlotTable& table, int j, int warp,
                                         int g, int q, float v[8]) {
  const float* src = nullptr;
  if (g < a.rows) {
    if (j == 0) {
      src = a.sact + static_cast<int64_t>(g) * a.m.shared_inter;
    } else if (table.slot[j - 1][g] >= 0) {
      src = a.act + (static_cast<int64_t>(g) * a.m.top_k + table.slot[j - 1][g]) * a.m.inter;
    }
  }
  if (src != nullptr) {
    load_x8<true>(src + warp * DownShape::kSlice + 8 * q, v);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = 0.0f;
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    moe_down_stream_kernel(const __grid_constant__ MoeStreamArgs a) {
  using S = DownShape;
  static_assert(S::kChunks == 1 && S::kBlocks32 == 1, "down products of one 512-column chunk");
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ SlotTable table;
  const Ring<S> ring(smem);
  const MoeLaunch& m = a.m;
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int col_tiles = m.hidden / kTile;
  const int G = static_cast<int>(gridDim.x);
  if (threadIdx.x == 0) ring.init();
  __syncthreads();
  pdl_launch_dependents();

  if (warp == kConsumers) {
    int f = 0;
    auto fill = [&](int nt, int j) {
      const DevMatrix& w = j == 0 ? m.sh_down : m.down;
      const uint16_t* rows = expert_data(w, j == 0 ? 0 : a.used[j - 1]) +
                             static_cast<int64_t>(nt * kTile + (lane & 15)) * S::kCols;
      ring.begin_fill(f, lane);
      if (lane < kTile) ring.copy_row(f, lane, rows);
      ++f;
    };
    fill(static_cast<int>(blockIdx.x), 0);  // the shared expert's rows, before the route is known
    pdl_wait();
    const int count = *a.count;
    for (int nt = static_cast<int>(blockIdx.x); nt < col_tiles; nt += G) {
      for (int j = nt == static_cast<int>(blockIdx.x) ? 1 : 0; j <= count; ++j) fill(nt, j);
    }
    return;
  }

  pdl_wait();
  const int count = *a.count;
  build_slots(a, a.sel, a.wts, a.used, count, &table);
  const int g = lane >> 2, q = lane & 3;
  const int col = column_bytes<S>(warp, q);
  const int off = static_cast<int>(threadIdx.x >> 3), r = static_cast<int>(threadIdx.x & 7);
  const bool owner = threadIdx.x < kTile * 8;  // of output (column tile row off, step row r)
  float v[8];
  int f = 0, buf = 0;
  for (int nt = static_cast<int>(blockIdx.x); nt < col_tiles; nt += G) {
    float acc = 0.0f, ys = 0.0f;
    load_act(a, table, 0, warp, g, q, v);
    for (int j = 0; j <= count; ++j, ++f) {
      uint32_t frag[1][8];
      split_fragment(v, frag[0]);
      if (j < count) load_act(a, table, j + 1, warp, g, q, v);  // in flight during this expert
      float part[4] = {};
      ring.wait_full(f);
      mma_chunk<S>(part, ring.stage(f) + col, g, frag);
      ring.release(f, lane);
      publish(ring.part, buf, warp, lane, part);
      if (owner) {
        const float y = tile_output(ring.part, buf, off, r);
        if (j == 0) {
          ys = y;
        } else if (table.slot[j - 1][r] >= 0) {
          acc = acc + y * table.wt[j - 1][r];
        }
      }
      buf ^= 1;
    }
    if (owner && r < a.rows) {
      const float out = acc + sigmoidf_(a.sg[r]) * ys;
      float* o = m.out + r * m.out_stride + static_cast<int64_t>(nt) * kTile + off;
      *o = m.accumulate ? *o + out : out;
    }
  }
}

int kb_of(int64_t cols) {
  return static_cast<int>(cols / 512);
}

template <int KB>
void launch_up_kb(const MoeStreamArgs& a, cudaStream_t stream) {
  constexpr int kSmem = Shape<KB>::kSmemBytes;
  if (reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && a.xs % 4 == 0) {
    static const int sms = prepare_kernel<Shape<KB>>(moe_up_stream_kernel<KB, true>);
    launch_pdl(moe_up_stream_kernel<KB, true>, dim3(sms), dim3(kThreads), kSmem, stream, a);
  } else {
    static const int sms = prepare_kernel<Shape<KB>>(moe_up_stream_kernel<KB, false>);
    launch_pdl(moe_up_stream_kernel<KB, false>, dim3(sms), dim3(kThreads), kSmem, stream, a);
  }
}

void launch_down(const MoeStreamArgs& a, cudaStream_t stream) {
  static const int sms = prepare_kernel<DownShape>(moe_down_stream_kernel);
  const int col_tiles = a.m.hidden / kTile;
  launch_pdl(moe_down_stream_kernel, dim3(col_tiles < sms ? col_tiles : sms), dim3(kThreads),
             DownShape::kSmemBytes, stream, a);
}

bool bf16_aligned(const DevMatrix& m) {
  return m.fmt == WFmt::kBF16 && reinterpret_cast<uintptr_t>(m.data) % 16 == 0 && m.data_stride % 16 == 0;
}

}  // namespace

bool moe_stream_supported(const MoeLaunch& m) {
  static const bool enabled = [] {
    const char* v = std::getenv("PD_MOE_STREAM");
    return v == nullptr || v[0] != '0';
  }();
  const int64_t H = m.hidden, I = m.inter;
  return enabled && m.router_gate_fused && m.router.fmt == WFmt::kBF16 && !m.shared_format_differs &&
         m.top_k <= kStreamTopK && m.shared_inter == I && (H == 512 || H == 1024 || H == 2048 || H == 4096) &&
         I == 512 && bf16_aligned(m.gate) && bf16_aligned(m.up) && bf16_aligned(m.down) &&
         bf16_aligned(m.sh_gate) && bf16_aligned(m.sh_up) && bf16_aligned(m.sh_down) && m.gate.cols == H &&
         m.up.cols == H && m.sh_gate.cols == H && m.sh_up.cols == H && m.down.cols == I &&
         m.sh_down.cols == I;
}

void launch_moe_stream_up(const MoeStreamArgs& a, cudaStream_t stream) {
  switch (kb_of(a.m.hidden)) {
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
  launch_down(a, stream);
}

}  // namespace pd::cuda
