// The down + combine kernel of a decode MoE block on the weight stream (moe_stream_tiles.cuh).
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
#include "puredrive/backend/cuda/moe_stream_tiles.cuh"
#include "puredrive/backend/cuda/trace.cuh"

namespace pd::cuda {
namespace {

using namespace moe_tiles;

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
template <typename W, int SPLIT_PPS = 0>
void launch_down(const MoeStreamArgs& a, cudaStream_t stream) {
  PD_TRACE_ENSURE();
  static const int sms = prepare_kernel<typename W::S>(moe_down_stream_kernel<W, SPLIT_PPS>);
  const int col_tiles = a.m.hidden / kTile;
  launch_kernel<W>(moe_down_stream_kernel<W, SPLIT_PPS>, a, col_tiles < sms ? col_tiles : sms, stream);
}
}  // namespace

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
