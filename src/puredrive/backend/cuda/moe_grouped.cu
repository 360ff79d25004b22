// The sparse MoE block for prefill steps (backend.h MoeArgs; spec §6) as grouped tensor-core products over
// every row of the step at once, with no host synchronisation (a recorded step replays it as one graph):
// 1. router and shared-expert gate logits (launch_mma);
// 2. route each row with the decode route's arithmetic (launch_moe_route_rows);
// 3. counting sort of the (row, slot) pairs by expert (moe_partition.h): a block per expert lists, in
//    ascending row order, the rows that selected it; then the experts' first row tiles;
// 4. gate/up: one launch over every expert's row tiles and the shared expert's rows,
//    act[entry] = silu(x Wg^T) * (x Wu^T);
// 5. down: the same over the activations, y[entry] = act Wd^T and ys = sact Wsd^T;
// 6. combine per (row, column) in the decode path's order: the row's experts in ascending id (its slots),
// then
//    the gated shared expert (launch_moe_combine).
// Grids are sized for the worst routing (max_moe_tiles) and blocks without a tile exit, so the launches do
// not depend on the routing. Each expert's weights are read once per row tile of its entries, and a row's
// result depends only on that row.
#include <algorithm>

#include "puredrive/backend/cuda/common.cuh"
#include "puredrive/backend/cuda/moe_partition.h"
#include "puredrive/backend/cuda/scratch_carver.h"

namespace pd::cuda {
namespace {

struct Grouped {
  float* logits;    // [R, E]
  float* sg;        // [R]
  int* sel;         // [R, K], ascending expert id
  float* wts;       // [R, K]
  int* list;        // [E, R]: entries r * K + slot of each expert
  int* count;       // [E]
  int* tile_start;  // [E + 1]
  float* act;       // [R * K, I]
  float* sact;      // [R, Is]
  float* y;         // [R * K, H]
  float* ys;        // [R, H]
  void* tma;        // the wgmma products' activation copies (mma_tma_scratch_bytes); null without them
};

Grouped carve(void* base, int R, int E, int K, int H, int I, int Is, int64_t* total) {
  ScratchCarver c(base);
  const int64_t rows = R, entries = int64_t{R} * K;
  Grouped g{};
  g.logits = c.take<float>(rows * E);
  g.sg = c.take<float>(rows);
  g.sel = c.take<int>(entries);
  g.wts = c.take<float>(entries);
  g.list = c.take<int>(int64_t{E} * rows);
  g.count = c.take<int>(E);
  g.tile_start = c.take<int>(int64_t{E} + 1);
  g.act = c.take<float>(entries * I);
  g.sact = c.take<float>(rows * Is);
  g.y = c.take<float>(entries * H);
  g.ys = c.take<float>(rows * H);
  if (mma_tma_available()) {
    // The larger of the two products' copies: every tile's rows of the routed experts' input and the
    // shared expert's rows.
    const int64_t tiles = std::max(max_moe_tiles(R, K, E, kMmaRows), tiles_for_rows(R, kMmaRows));
    const int64_t gathered = tiles * kMmaRows;
    g.tma = c.take<uint8_t>(std::max(mma_tma_part_bytes(gathered, H) + mma_tma_part_bytes(rows, H),
                                     mma_tma_part_bytes(gathered, I) + mma_tma_part_bytes(rows, Is)));
  }
  if (total != nullptr) *total = c.bytes();
  return g;
}

constexpr int kSortThreads = 256;

// Block e: the rows that selected expert e, ascending, as entries r * K + slot (a stable counting sort: each
// pass over kSortThreads rows places its entries after the previous passes').
__global__ void __launch_bounds__(kSortThreads)
    moe_sort_kernel(const int* sel, int rows, int K, int* list, int* count) {
  pdl_enter();
  __shared__ int warp_total[kSortThreads / 32];
  const int e = static_cast<int>(blockIdx.x);
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  int placed = 0;
  for (int r0 = 0; r0 < rows; r0 += kSortThreads) {
    const int r = r0 + static_cast<int>(threadIdx.x);
    int slot = -1;
    if (r < rows) {
      for (int k = 0; k < K; ++k) {
        if (sel[static_cast<int64_t>(r) * K + k] == e) slot = k;
      }
    }
    const unsigned ballot = __ballot_sync(0xffffffffu, slot >= 0);
    if (lane == 0) warp_total[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, total = 0;
    for (int w = 0; w < kSortThreads / 32; ++w) {
      if (w < warp) before += warp_total[w];
      total += warp_total[w];
    }
    if (slot >= 0) {
      const int at = placed + before + __popc(ballot & ((1u << lane) - 1u));
      list[static_cast<int64_t>(e) * rows + at] = r * K + slot;
    }
    placed += total;
    __syncthreads();  // warp_total is rewritten by the next pass
  }
  if (threadIdx.x == 0) count[e] = placed;
}

// One block, a thread per expert: tile_start[e + 1] = sum over e' <= e of the row tiles of e'.
__global__ void moe_tile_starts_kernel(const int* count, int E, int* tile_start) {
  pdl_enter();
  __shared__ int warp_total[32];
  const int e = static_cast<int>(threadIdx.x);
  const int lane = e & 31, warp = e >> 5;
  int incl = e < E ? tiles_for_rows(count[e], kMmaRows) : 0;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += v;
  }
  if (lane == 31) warp_total[warp] = incl;
  __syncthreads();
  int before = 0;
  for (int w = 0; w < warp; ++w) before += warp_total[w];
  if (e < E) tile_start[e + 1] = before + incl;
  if (e == 0) tile_start[0] = 0;
}

// A product job on wgmma + TMA when that takes it (gemm_tma.cu), else on mma.sync.
void launch_products(const MmaJob& j, int m_tiles, const Grouped& g, cudaStream_t stream) {
  if (g.tma != nullptr && mma_tma_takes(j)) {
    launch_mma_tma(j, m_tiles, g.tma, stream);
  } else {
    launch_mma(j, m_tiles, stream);
  }
}

bool same_kind(const DevMatrix& a, const DevMatrix& b) {
  return a.fmt == b.fmt && a.bits == b.bits;
}

// Appends a part computing `out` from x with matrix w (and w2 for a gate/up pair), its weight-row tiles
// following the previous parts'.
void add_part(MmaJob& j, const DevMatrix& w, const DevMatrix* w2, const float* x, int64_t xs, float* out,
              int64_t os, int rows, bool grouped, int list_div) {
  MmaPart& p = j.part[j.parts];
  p.w = w;
  if (w2 != nullptr) p.w2 = *w2;
  p.x = x;
  p.xs = xs;
  p.out = out;
  p.os = os;
  p.rows = rows;
  p.grouped = grouped;
  p.list_div = list_div;
  if (j.parts == 0) j.tile_cols = mma_tile_cols(w, w2);
  const int per_tile = j.tile_cols / (w2 != nullptr ? 2 : 1);
  const int before = j.parts == 0 ? 0 : j.part[j.parts - 1].n_tiles_end;
  p.n_tiles_end = before + tiles_for_rows(static_cast<int>(w.rows), per_tile);
  ++j.parts;
}

}  // namespace

int64_t moe_grouped_scratch_bytes(int rows, int experts, int top_k, int hidden, int inter, int shared_inter) {
  int64_t total = 0;
  carve(nullptr, rows, experts, top_k, hidden, inter, shared_inter, &total);
  return total;
}

void launch_moe_partition(const int* sel, int rows, int top_k, int experts, int* list, int* count,
                          int* tile_start, cudaStream_t stream) {
  launch_pdl(moe_sort_kernel, dim3(static_cast<unsigned>(experts)), dim3(kSortThreads), 0, stream, sel, rows,
             top_k, list, count);
  const int threads = (experts + 31) / 32 * 32;
  launch_pdl(moe_tile_starts_kernel, dim3(1), dim3(static_cast<unsigned>(threads)), 0, stream,
             static_cast<const int*>(count), experts, tile_start);
}

void launch_moe_grouped(const MoeLaunch& m, cudaStream_t stream) {
  const int R = m.rows;
  if (R <= 0) return;
  const int E = m.experts, K = m.top_k;
  const Grouped g = carve(m.scratch, R, E, K, m.hidden, m.inter, m.shared_inter, nullptr);
  const int row_tiles = tiles_for_rows(R, kMmaRows);

  // Router logits and the shared expert's gate, one launch when their formats agree.
  MmaJob route;
  add_part(route, m.router, nullptr, m.x, m.x_stride, g.logits, E, R, false, 1);
  if (same_kind(m.router, m.shared_gate)) {
    add_part(route, m.shared_gate, nullptr, m.x, m.x_stride, g.sg, 1, R, false, 1);
  } else {
    MmaJob sg;
    add_part(sg, m.shared_gate, nullptr, m.x, m.x_stride, g.sg, 1, R, false, 1);
    launch_mma(sg, row_tiles, stream);
  }
  launch_mma(route, row_tiles, stream);
  launch_moe_route_rows(m, R, g.logits, g.sel, g.wts, stream);
  launch_moe_partition(g.sel, R, K, E, g.list, g.count, g.tile_start, stream);

  MmaJob lists;
  lists.list = g.list;
  lists.list_stride = R;
  lists.count = g.count;
  lists.tile_start = g.tile_start;
  lists.experts = E;
  const int expert_tiles = max_moe_tiles(R, K, E, kMmaRows);
  const int both_tiles = expert_tiles > row_tiles ? expert_tiles : row_tiles;

  // gate/up of the routed experts and (in the same launch when the formats agree) of the shared expert.
  MmaJob up = lists;
  up.dual = true;
  add_part(up, m.gate, &m.up, m.x, m.x_stride, g.act, m.inter, 0, true, K);
  if (same_kind(m.sh_gate, m.gate) && same_kind(m.sh_up, m.up)) {
    add_part(up, m.sh_gate, &m.sh_up, m.x, m.x_stride, g.sact, m.shared_inter, R, false, 1);
    launch_products(up, both_tiles, g, stream);
  } else {
    launch_products(up, expert_tiles, g, stream);
    MmaJob su;
    su.dual = true;
    add_part(su, m.sh_gate, &m.sh_up, m.x, m.x_stride, g.sact, m.shared_inter, R, false, 1);
    launch_products(su, row_tiles, g, stream);
  }

  // down, likewise.
  MmaJob down = lists;
  add_part(down, m.down, nullptr, g.act, m.inter, g.y, m.hidden, 0, true, 1);
  if (same_kind(m.sh_down, m.down)) {
    add_part(down, m.sh_down, nullptr, g.sact, m.shared_inter, g.ys, m.hidden, R, false, 1);
    launch_products(down, both_tiles, g, stream);
  } else {
    launch_products(down, expert_tiles, g, stream);
    MmaJob sd;
    add_part(sd, m.sh_down, nullptr, g.sact, m.shared_inter, g.ys, m.hidden, R, false, 1);
    launch_products(sd, row_tiles, g, stream);
  }

  launch_moe_combine(m, R, g.y, g.wts, g.sg, g.ys, stream);
}

}  // namespace pd::cuda
