// The sparse MoE block (backend.h MoeArgs; spec §6) per chunk of up to kMaxRows rows, with no host
// synchronisation:
// 1. the router and shared-expert gate products (one launch), whose last block to finish routes the chunk
//    (moe_route.cuh):
//    fp32 softmax, top-k by (probability desc, id asc), renormalised in selection order, sorted by expert id;
//    the list of experts any row selected, ascending;
// 2. up: grid over (used expert, output rows) plus the shared expert: act = silu(x Wg^T) * (x Wu^T) for the
//    rows that selected the expert; blocks past the number of used experts exit;
// 3. down: the same grid over the hidden outputs: y = act Wd^T;
// 4. combine per (row, column): ((0 + w_1 y_1) + w_2 y_2 ...) over the selected experts in ascending id, then
//    + sigmoid(x . w_sg) * y_shared, as the CPU backend sums.
// Each expert's weights are read once per chunk for all rows that use it; a row's result depends only on
// that row. bf16 blocks of the widths moe_stream_supported takes run all four steps in moe_stream_up.cu and
// moe_stream_down.cu instead (weights streamed through shared memory, tensor cores; the router fused into the
// gate/up kernel). Wider steps run moe_grouped.cu (tensor cores) or moe_wide.cu (tiled reference path), which
// share this file's route and combine kernels (launch_moe_route_rows, launch_moe_combine).
#include "puredrive/backend/cuda/common.cuh"
#include "puredrive/backend/cuda/moe_route.cuh"
#include "puredrive/backend/cuda/moe_stream.h"
#include "puredrive/backend/cuda/scratch_carver.h"

namespace pd::cuda {
namespace {

struct MoeScratch {
  float* logits;  // [kMaxRows][E]
  float* sg;      // [kMaxRows]
  int* sel;       // [kMaxRows][K], ascending expert id
  float* wts;     // [kMaxRows][K]
  int* used;      // [E]: selected experts, ascending
  int* count;     // [1]: number of used experts
  float* act;     // [kMaxRows][K][I]
  float* sact;    // [kMaxRows][Is]
  float* y;       // [kMaxRows][K][H]
  float* ys;      // [kMaxRows][H]
};

MoeScratch carve(void* base, int E, int K, int H, int I, int Is, int64_t* total) {
  ScratchCarver c(base);
  const int64_t R = kMaxRows;
  MoeScratch s;
  s.logits = c.take<float>(R * E);
  s.sg = c.take<float>(R);
  s.sel = c.take<int>(R * K);
  s.wts = c.take<float>(R * K);
  s.used = c.take<int>(E);
  s.count = c.take<int>(1);
  s.act = c.take<float>(R * K * I);
  s.sact = c.take<float>(R * Is);
  s.y = c.take<float>(R * K * H);
  s.ys = c.take<float>(R * H);
  if (total != nullptr) *total = c.bytes();
  return s;
}

// The router and shared-expert gate products of a chunk (output n < E: router row n, n == E: the gate, when
// with_gate), one warp per output as gemv; the last block to finish then routes every row (warp r routes
// row r) and writes the ascending list of used experts.
template <int FMT, int BITS, int NR>
__global__ void __launch_bounds__(kBlock)
    moe_router_kernel(MoeLaunch m, const float* x, int64_t xs, int rows, bool with_gate, MoeScratch s) {
  __shared__ int last;
  __shared__ uint32_t bits[kMaxExpertWords];
  __shared__ int before[kMaxExpertWords];
  const int E = m.experts, K = m.top_k;
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * (kBlock / 32);
  const int64_t total = E + with_gate;
  pdl_launch_dependents();
  const int64_t first = static_cast<int64_t>(blockIdx.x) * (kBlock / 32) + warp;
  if (first < E) prefetch_row_l2(m.router, m.router.data, first, lane);
  pdl_wait();
  for (int64_t n = first; n < total; n += stride) {
    router_output<FMT, BITS, true, NR>(m, n, x, xs, rows, lane, s.logits, s.sg);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(m.router_ticket, 1) == static_cast<int>(gridDim.x) - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (warp < rows)
    route_row(s.logits + static_cast<int64_t>(warp) * E, E, K, m.norm_topk, s.sel + warp * K,
              s.wts + warp * K);
  list_used_experts(s.sel, rows * K, E, kBlock, bits, before, s.used, s.count, [] { __syncthreads(); });
  if (threadIdx.x == 0) {
    *m.router_ticket = 0;
    if (m.experts_read != nullptr) atomicAdd(m.experts_read, static_cast<unsigned long long>(*s.count));
  }
}

__device__ __forceinline__ void expert_ptrs(const DevMatrix& m, int e, const void** d, const void** sc,
                                            const void** b) {
  *d = static_cast<const uint8_t*>(m.data) + static_cast<int64_t>(e) * m.data_stride;
  *sc = m.scales == nullptr
            ? nullptr
            : static_cast<const uint8_t*>(m.scales) + static_cast<int64_t>(e) * m.scale_stride;
  *b = m.biases == nullptr ? nullptr
                           : static_cast<const uint8_t*>(m.biases) + static_cast<int64_t>(e) * m.scale_stride;
}

// u = first + blockIdx.x: used-expert slot u (< umax) or umax for the shared expert; blockIdx.y: 8 output
// rows, one per warp. NR >= rows (rows_class). Every matrix a launch reads has the format FMT/BITS (FMT
// kAnyFmt: formats dispatched per matrix at run time, for checkpoints whose gate and up differ): when the
// shared expert's format differs from the routed experts', it gets a launch of its own (first = umax).
template <int FMT, int BITS, int NR>
__global__ void __launch_bounds__(kBlock)
    moe_up_kernel(MoeLaunch m, const float* x, int64_t xs, int rows, int umax, int first, MoeScratch s) {
  const int u = first + static_cast<int>(blockIdx.x);
  const bool shared = u == umax;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t n = static_cast<int64_t>(blockIdx.y) * (kBlock / 32) + (threadIdx.x >> 5);
  const int64_t width = shared ? m.shared_inter : m.inter;
  pdl_launch_dependents();
  if (shared && n < width) {  // the shared expert's rows are known before the route
    prefetch_row_l2(m.sh_gate, m.sh_gate.data, n, lane);
    prefetch_row_l2(m.sh_up, m.sh_up.data, n, lane);
  }
  pdl_wait();
  int e = 0;
  if (!shared) {
    if (u >= *s.count) return;
    e = s.used[u];
  }
  if (n >= width) return;
  int slot[NR];
  uint32_t mask = 0;
  const float* xr[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    slot[r] = -1;
    if (r < rows) {
      if (shared) {
        slot[r] = 0;
      } else {
        for (int i = 0; i < m.top_k; ++i) {
          if (s.sel[r * m.top_k + i] == e) slot[r] = i;
        }
      }
    }
    if (slot[r] >= 0) mask |= 1u << r;
    xr[r] = x + r * xs;
  }
  const DevMatrix& gm = shared ? m.sh_gate : m.gate;
  const DevMatrix& um = shared ? m.sh_up : m.up;
  float ga[NR] = {}, ua[NR] = {};
  const void *d, *sc, *b;
  if constexpr (FMT == kAnyFmt) {
    expert_ptrs(gm, shared ? 0 : e, &d, &sc, &b);
    dot_rows_any<true, NR>(gm, d, sc, b, n, xr, mask, lane, ga);
    expert_ptrs(um, shared ? 0 : e, &d, &sc, &b);
    dot_rows_any<true, NR>(um, d, sc, b, n, xr, mask, lane, ua);
  } else {
    const void *d2, *sc2, *b2;
    expert_ptrs(gm, shared ? 0 : e, &d, &sc, &b);
    expert_ptrs(um, shared ? 0 : e, &d2, &sc2, &b2);
    dot_rows2<FMT, BITS, true, NR>(gm, d, sc, b, um, d2, sc2, b2, n, xr, mask, lane, ga, ua);
  }
  warp_sum_rows<NR>(ga, rows);
  warp_sum_rows<NR>(ua, rows);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if ((mask >> r) & 1u) {
        const float v = siluf_(ga[r]) * ua[r];
        if (shared) {
          s.sact[r * m.shared_inter + n] = v;
        } else {
          s.act[(static_cast<int64_t>(r) * m.top_k + slot[r]) * m.inter + n] = v;
        }
      }
    }
  }
}

// Products of output row n of G matrices of one format (the down projections of G experts) with G inputs,
// lane-chunk order as dot_rows, so each result is bitwise what dot_rows gives; the loads of all G matrices
// are issued before their products.
template <int FMT, int BITS, int G, int SD>
__device__ __forceinline__ void dot_group_sd(const DevMatrix& m, const void* const data[G],
                                             const void* const scales[G], const void* const biases[G],
                                             int64_t n, const float* const x[G], int valid, int lane,
                                             float acc[G]) {
  constexpr int kBatch = 2;
  const int64_t chunks = m.cols / 8;
  for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kBatch) {
    RawW8 raw[G][kBatch];
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int64_t c = c0 + 32 * u;
        if (g < valid && c < chunks) {
          raw[g][u] = load_raw8<FMT, BITS, SD>(m, data[g], scales[g], biases[g], n, c);
        }
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (g >= valid) break;
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int64_t c = c0 + 32 * u;
        if (c >= chunks) break;
        float w[8], xv[8];
        decode8<FMT, BITS>(raw[g][u], w);
        load_x8<true>(x[g] + c * 8, xv);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[g] = fmaf(xv[j], w[j], acc[g]);
      }
    }
  }
}

template <int FMT, int BITS, int G>
__device__ __forceinline__ void dot_group(const DevMatrix& m, const void* const data[G],
                                          const void* const scales[G], const void* const biases[G], int64_t n,
                                          const float* const x[G], int valid, int lane, float acc[G]) {
  with_scale_dtype<FMT>(m.scale_dtype, [&](auto sd) {
    dot_group_sd<FMT, BITS, G, decltype(sd)::value>(m, data, scales, biases, n, x, valid, lane, acc);
  });
}

// Down projection and combine in one pass: warp w of block (b, r) owns hidden output n = 8 b + w of row r
// and sums the row's selected experts in ascending id, ((0 + w_1 y_1) + w_2 y_2) + ..., then adds the gated
// shared expert, and writes (or adds) the result. One row per block (not a loop over the rows in each warp):
// a verify step's rows then cost their bytes, not rows x round trips (H200, same-run A/B: R=3/R=1 1.65
// -> 1.60, MTP cycle 7.48 -> 7.27 ms). Each y is the warp-summed product of dot_rows' order, so the sums
// equal those of separate down and combine kernels, and a row's result depends on that row alone. The shared
// expert's down product is computed here when it has the routed experts' format, else read from s.ys.
template <int FMT, int BITS>
__global__ void __launch_bounds__(kBlock) moe_down_combine_kernel(MoeLaunch m, MoeScratch s) {
  pdl_enter();
  constexpr int G = 4;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t n = static_cast<int64_t>(blockIdx.x) * (kBlock / 32) + (threadIdx.x >> 5);
  if (n >= m.hidden) return;
  const int K = m.top_k;
  const int r = static_cast<int>(blockIdx.y);
  float acc = 0.0f;
  for (int k0 = 0; k0 < K; k0 += G) {
    const int valid = K - k0 < G ? K - k0 : G;
    const void* data[G];
    const void* scales[G];
    const void* biases[G];
    const float* x[G];
    float y[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int k = k0 + (g < valid ? g : 0);
      expert_ptrs(m.down, s.sel[r * K + k], &data[g], &scales[g], &biases[g]);
      x[g] = s.act + (static_cast<int64_t>(r) * K + k) * m.inter;
      y[g] = 0.0f;
    }
    dot_group<FMT, BITS, G>(m.down, data, scales, biases, n, x, valid, lane, y);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (g < valid) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) y[g] += __shfl_xor_sync(0xffffffffu, y[g], off);
        acc = acc + y[g] * s.wts[r * K + k0 + g];
      }
    }
  }
  float sh[1] = {};
  const float* xs[1] = {s.sact + static_cast<int64_t>(r) * m.shared_inter};
  const DevMatrix& sd = m.sh_down;
  if (m.shared_format_differs) {
    sh[0] = s.ys[r * m.hidden + n];
  } else {
    dot_rows<FMT, BITS, true, 1>(sd, sd.data, sd.scales, sd.biases, n, xs, 1u, lane, sh);
    warp_sum_rows<1>(sh, 1);
  }
  if (lane == 0) {
    const float v = acc + sigmoidf_(s.sg[r]) * sh[0];
    float* o = m.out + r * m.out_stride + n;
    *o = m.accumulate ? *o + v : v;
  }
}

void launch_down_combine(const MoeLaunch& m, int rows, const MoeScratch& s, cudaStream_t stream) {
  const dim3 grid(grid_for(m.hidden, kBlock / 32), static_cast<unsigned>(rows));
  if (m.shared_format_differs) {
    launch_gemv(m.sh_down, s.sact, m.shared_inter, s.ys, m.hidden, rows, false, stream);
  }
  with_format(m.down.fmt, m.down.bits, [&](auto f) {
    launch_pdl(moe_down_combine_kernel<decltype(f)::kFmt, decltype(f)::kBits>, grid, dim3(kBlock), 0, stream,
               m, s);
  });
}

__global__ void moe_combine_kernel(MoeLaunch m, int rows, MoeScratch s) {
  const int64_t total = static_cast<int64_t>(rows) * m.hidden;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(i / m.hidden);
    const int64_t n = i % m.hidden;
    float acc = 0.0f;
    for (int k = 0; k < m.top_k; ++k) {
      acc = acc + s.y[(static_cast<int64_t>(r) * m.top_k + k) * m.hidden + n] * s.wts[r * m.top_k + k];
    }
    const float v = acc + sigmoidf_(s.sg[r]) * s.ys[r * m.hidden + n];
    float* o = m.out + r * m.out_stride + n;
    *o = m.accumulate ? *o + v : v;
  }
}

// Warp w of block b routes row 8 b + w, with the decode route's arithmetic.
__global__ void __launch_bounds__(kBlock)
    moe_route_rows_kernel(int E, int K, int rows, bool norm, MoeScratch s) {
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int r = static_cast<int>(blockIdx.x) * (kBlock / 32) + warp;
  if (r >= rows) return;
  route_row(s.logits + static_cast<int64_t>(r) * E, E, K, norm, s.sel + r * K, s.wts + r * K);
}

}  // namespace

void launch_moe_route_rows(const MoeLaunch& m, int rows, const float* logits, int* sel, float* wts,
                           cudaStream_t stream) {
  MoeScratch s{};
  s.logits = const_cast<float*>(logits);
  s.sel = sel;
  s.wts = wts;
  moe_route_rows_kernel<<<grid_for(rows, kBlock / 32), kBlock, 0, stream>>>(m.experts, m.top_k, rows,
                                                                            m.norm_topk, s);
}

void launch_moe_combine(const MoeLaunch& m, int rows, const float* y, const float* wts, const float* sg,
                        const float* ys, cudaStream_t stream) {
  MoeScratch s{};
  s.y = const_cast<float*>(y);
  s.wts = const_cast<float*>(wts);
  s.sg = const_cast<float*>(sg);
  s.ys = const_cast<float*>(ys);
  const int64_t total = static_cast<int64_t>(rows) * m.hidden;
  const unsigned blocks = grid_for(total, kBlock) < 4096 ? grid_for(total, kBlock) : 4096;
  moe_combine_kernel<<<blocks, kBlock, 0, stream>>>(m, rows, s);
}

int64_t moe_scratch_bytes(int experts, int top_k, int hidden, int inter, int shared_inter) {
  int64_t total = 0;
  carve(nullptr, experts, top_k, hidden, inter, shared_inter, &total);
  const int64_t wide = moe_wide_scratch_bytes(experts, top_k, hidden, inter, shared_inter);
  return total > wide ? total : wide;
}

namespace {

// Runs the MoE block; when ev is not null, records ev[0..kMoePhases] between its phases.
void run_moe(const MoeLaunch& m, cudaStream_t stream, cudaEvent_t* ev) {
  const MoeScratch s = carve(m.scratch, m.experts, m.top_k, m.hidden, m.inter, m.shared_inter, nullptr);
  const int up_width = m.inter > m.shared_inter ? m.inter : m.shared_inter;
  auto mark = [&](int i) {
    if (ev != nullptr) cudaEventRecord(ev[i], stream);
  };
  for (int r0 = 0; r0 < m.rows; r0 += kMaxRows) {
    const int n = m.rows - r0 < kMaxRows ? m.rows - r0 : kMaxRows;
    const float* x = m.x + r0 * m.x_stride;
    mark(0);
    if (moe_stream_supported(m)) {  // the gate/up kernel routes the chunk itself
      mark(1);
      MoeLaunch chunk = m;
      chunk.out = m.out + r0 * m.out_stride;
      const MoeStreamArgs a{.m = chunk,
                            .x = x,
                            .xs = m.x_stride,
                            .rows = n,
                            .logits = s.logits,
                            .sel = s.sel,
                            .wts = s.wts,
                            .used = s.used,
                            .count = s.count,
                            .sg = s.sg,
                            .act = s.act,
                            .sact = s.sact};
      launch_moe_stream_up(a, stream);
      mark(2);
      launch_moe_stream_down(a, stream);
      mark(3);
      continue;
    }
    // Router (+ shared gate when it has the router's format) and route in one launch.
    if (!m.router_gate_fused) launch_gemv(m.shared_gate, x, m.x_stride, s.sg, 1, n, false, stream);
    const dim3 router_grid(grid_for(m.experts + (m.router_gate_fused ? 1 : 0), kBlock / 32));
    with_format(m.router.fmt, m.router.bits, [&](auto f) {
      with_rows_class(n, [&](auto nr) {
        launch_pdl(moe_router_kernel<decltype(f)::kFmt, decltype(f)::kBits, decltype(nr)::value>, router_grid,
                   dim3(kBlock), 0, stream, m, x, m.x_stride, n, m.router_gate_fused, s);
      });
    });
    mark(1);
    const int umax = n * m.top_k < m.experts ? n * m.top_k : m.experts;
    // The routed experts and, when it shares their format, the shared expert (block umax) in one launch.
    const unsigned up_rows = grid_for(up_width, kBlock / 32);
    const bool split = m.shared_format_differs;
    auto up = [&](const DevMatrix& g, const DevMatrix& u, unsigned blocks, int first) {
      with_rows_class(n, [&](auto nr) {
        constexpr int NR = decltype(nr)::value;
        if (g.fmt != u.fmt || g.bits != u.bits) {
          launch_pdl(moe_up_kernel<kAnyFmt, 0, NR>, dim3(blocks, up_rows), dim3(kBlock), 0, stream, m, x,
                     m.x_stride, n, umax, first, s);
          return;
        }
        with_format(g.fmt, g.bits, [&](auto f) {
          launch_pdl(moe_up_kernel<decltype(f)::kFmt, decltype(f)::kBits, NR>, dim3(blocks, up_rows),
                     dim3(kBlock), 0, stream, m, x, m.x_stride, n, umax, first, s);
        });
      });
    };
    up(m.gate, m.up, static_cast<unsigned>(split ? umax : umax + 1), 0);
    if (split) up(m.sh_gate, m.sh_up, 1, umax);
    mark(2);
    MoeLaunch chunk = m;
    chunk.out = m.out + r0 * m.out_stride;
    launch_down_combine(chunk, n, s, stream);
    mark(3);
  }
}

}  // namespace

void launch_moe(const MoeLaunch& m, cudaStream_t stream) {
  if (m.rows > kMaxRows) {
    launch_moe_wide(m, stream);
    return;
  }
  run_moe(m, stream, nullptr);
}

void launch_moe_profiled(const MoeLaunch& m, cudaStream_t stream, double ms[kMoePhases]) {
  for (int r0 = 0; r0 < m.rows; r0 += kMaxRows) {
    MoeLaunch chunk = m;
    chunk.x = m.x + r0 * m.x_stride;
    chunk.out = m.out + r0 * m.out_stride;
    chunk.rows = m.rows - r0 < kMaxRows ? m.rows - r0 : kMaxRows;
    cudaEvent_t ev[kMoePhases + 1];
    for (cudaEvent_t& e : ev) cudaEventCreate(&e);
    run_moe(chunk, stream, ev);
    cudaEventSynchronize(ev[kMoePhases]);
    for (int i = 0; i < kMoePhases; ++i) {
      float t = 0;
      cudaEventElapsedTime(&t, ev[i], ev[i + 1]);
      ms[i] += t;
    }
    for (cudaEvent_t& e : ev) cudaEventDestroy(e);
  }
}

}  // namespace pd::cuda
