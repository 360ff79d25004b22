// The router + gate/up kernel of a decode MoE block on the weight stream (moe_stream_tiles.cuh).
//
// Gate/up: a tile is 8 gate rows and the same 8 up rows of one expert (A rows 0-7 and 8-15), so one thread
// gets both sums of an output. Tiles are numbered shared expert first, then the used experts in ascending
// id; block b takes tiles b, b + G, ...; the shared expert's tiles are streamed before the route is known.
// act = silu(gate) * up is written for the rows that selected the expert.
//
// The route comes from the same kernel, while the producer streams the shared expert: the consumer warps
// compute the router and shared-gate outputs (router_slices: eight warps per output, spread over the
// blocks), the blocks meet at a grid barrier (one block per SM: every block of the grid is resident), and
// each block then routes every row itself and hands the used experts to its producer. A separate router
// kernel cost 11 us per layer (ncu, serialised): its latency chain plus a launch, before the experts could
// start.
#include "puredrive/backend/cuda/moe_route.cuh"
#include "puredrive/backend/cuda/moe_stream_tiles.cuh"
#include "puredrive/backend/cuda/trace.cuh"

namespace pd::cuda {
namespace {

using namespace moe_tiles;

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
// One atomic per block on *bar: block 0 adds 2^31 - (G - 1), the others 1, so the G arrivals add exactly 2^31
// and flip the top bit, which each block waits for; the low bits come back to where they were, so the word
// needs no reset. The barrier before (an arrival count that the last block reset, then a generation it
// advanced: two atomics and two fences on the last block's path) had the median block wait 3.1 us from its
// router outputs to the route (trace build, bench/results/2026-12-04-h200-d99e535-trace.md).
__device__ void grid_barrier(unsigned* bar) {
  const unsigned add = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1u) : 1u;
  __threadfence();
  const unsigned old = atomicAdd(bar, add);
  const volatile unsigned* now = bar;
  while (((old ^ *now) & 0x80000000u) == 0u) __nanosleep(32);
  __threadfence();
}

// The router's outputs of block b, n = b, b + G, ... (the E experts' logits, then n = E: the shared-expert
// gate), a pair at a time: consumer warp w takes output w / kRouterSlices of the pair and the
// (w % kRouterSlices)-th slice of its columns, and the slices' sums are added in slice order. One warp per
// output (two busy warps per block) took 2.0 us for the bf16 router and 5.3 us for the 8-bit one after the
// kernel's dependency wait (trace build, bench/results/2026-12-04-h200-d99e535-trace.md): each lane's eight
// chunks were a chain of loads and dependent products. RF: the router's format, the experts' (affine routers
// are 8-bit); NR: accumulators for the step's rows (a row's sum does not depend on how many). Its activation
// loads are scalar, so the kernel needs no variant for unaligned rows.
constexpr int kRouterSlices = kConsumers / 2;
constexpr int kRouterBatch = 2;  // a lane's chunks in flight: its whole slice of a 4096-column row
template <int RF, int NR>
__device__ __forceinline__ void router_slices(const MoeStreamArgs& a, int warp, int lane) {
  __shared__ float part[kConsumers][NR];
  constexpr int kBits = RF == static_cast<int>(WFmt::kAffine) ? 8 : 0;
  const MoeLaunch& m = a.m;
  const int64_t G = gridDim.x, E = m.experts;
  const int slice = warp % kRouterSlices;
  const int64_t chunks = m.hidden / 8;
  const int64_t begin = chunks * slice / kRouterSlices, end = chunks * (slice + 1) / kRouterSlices;
  const float* xr[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) xr[r] = a.x + r * a.xs;
  for (int64_t pair = blockIdx.x; pair <= E; pair += 2 * G) {  // the same trips for every warp
    const int64_t n = pair + G * (warp / kRouterSlices);
    float acc[NR] = {};
    if (n <= E) {
      const DevMatrix& w = n < E ? m.router : m.shared_gate;
      dot_rows<RF, kBits, false, NR, kRouterBatch>(w, w.data, w.scales, w.biases, n < E ? n : 0, xr,
                                                   (1u << a.rows) - 1u, lane, acc, begin, end);
      warp_sum_rows<NR>(acc, a.rows);
    }
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < NR; ++r) part[warp][r] = acc[r];
    }
    consumers_sync();
    const int o = static_cast<int>(threadIdx.x) / NR, r = static_cast<int>(threadIdx.x) % NR;
    const int64_t no = pair + G * o;
    if (o < 2 && r < a.rows && no <= E) {
      float sum = part[o * kRouterSlices][r];
#pragma unroll
      for (int k = 1; k < kRouterSlices; ++k) sum += part[o * kRouterSlices + k][r];
      if (no < E) {
        a.logits[r * E + no] = sum;
      } else {
        a.sg[r] = sum;
      }
    }
    if (pair + 2 * G <= E) consumers_sync();  // part is reused
  }
}
template <int RF>
__device__ __forceinline__ void router_outputs(const MoeStreamArgs& a, int warp, int lane) {
  if (a.rows == 1) {
    router_slices<RF, 1>(a, warp, lane);
  } else if (a.rows <= 4) {
    router_slices<RF, 4>(a, warp, lane);
  } else {
    router_slices<RF, kMaxRows>(a, warp, lane);
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
      grid_barrier(reinterpret_cast<unsigned*>(m.router_ticket + 1));
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
template <typename W>
void launch_up(const MoeStreamArgs& a, cudaStream_t stream) {
  PD_TRACE_ENSURE();
  static const int sms = prepare_kernel<typename W::S>(moe_up_stream_kernel<W>);
  static const bool warm = env_switch_on("PD_WARM_ROUTE");
  static const bool prefetch = env_switch_on("PD_MOE_PREFETCH");
  MoeStreamArgs b = a;
  b.warm_route = warm ? 1 : 0;
  b.prefetch_down = prefetch ? 1 : 0;
  launch_kernel<W>(moe_up_stream_kernel<W>, b, sms, stream);
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

}  // namespace pd::cuda
