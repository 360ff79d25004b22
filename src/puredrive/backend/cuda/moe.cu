// The sparse MoE block (backend.h MoeArgs; spec §6) per chunk of up to kMaxRows rows, with no host
// synchronisation: the router and shared-expert gate products, then
// 1. route (one block): fp32 softmax, top-k by (probability desc, id asc), renormalised in selection order,
//    sorted by expert id; the list of experts any row selected, ascending, and each expert's slot per row;
// 2. up: grid over (used expert, output rows) plus the shared expert: act = silu(x Wg^T) * (x Wu^T) for the
//    rows that selected the expert; blocks past the number of used experts exit;
// 3. down: the same grid over the hidden outputs: y = act Wd^T;
// 4. combine per (row, column): ((0 + w_1 y_1) + w_2 y_2 ...) over the selected experts in ascending id, then
//    + sigmoid(x . w_sg) * y_shared, as the CPU backend sums.
// Each expert's weights are read once per chunk for all rows that use it; a row's result depends only on
// that row.
#include "puredrive/backend/cuda/common.cuh"

namespace pd::cuda {
namespace {

struct MoeScratch {
  float* logits;  // [kMaxRows][E]
  float* sg;      // [kMaxRows]
  int* sel;       // [kMaxRows][K], ascending expert id
  float* wts;     // [kMaxRows][K]
  int* slot_of;   // [E][kMaxRows]: slot of the expert in the row's selection, or -1
  int* used;      // [E]: selected experts, ascending
  int* count;     // [1]: number of used experts
  float* act;     // [kMaxRows][K][I]
  float* sact;    // [kMaxRows][Is]
  float* y;       // [kMaxRows][K][H]
  float* ys;      // [kMaxRows][H]
};

int64_t align256(int64_t b) {
  return (b + 255) / 256 * 256;
}

MoeScratch carve(void* base, int E, int K, int H, int I, int Is, int64_t* total) {
  uint8_t* p = static_cast<uint8_t*>(base);
  int64_t off = 0;
  auto take = [&](int64_t bytes) {
    uint8_t* q = p == nullptr ? nullptr : p + off;
    off += align256(bytes);
    return q;
  };
  MoeScratch s;
  s.logits = reinterpret_cast<float*>(take(int64_t{kMaxRows} * E * 4));
  s.sg = reinterpret_cast<float*>(take(int64_t{kMaxRows} * 4));
  s.sel = reinterpret_cast<int*>(take(int64_t{kMaxRows} * K * 4));
  s.wts = reinterpret_cast<float*>(take(int64_t{kMaxRows} * K * 4));
  s.slot_of = reinterpret_cast<int*>(take(int64_t{E} * kMaxRows * 4));
  s.used = reinterpret_cast<int*>(take(int64_t{E} * 4));
  s.count = reinterpret_cast<int*>(take(4));
  s.act = reinterpret_cast<float*>(take(int64_t{kMaxRows} * K * I * 4));
  s.sact = reinterpret_cast<float*>(take(int64_t{kMaxRows} * Is * 4));
  s.y = reinterpret_cast<float*>(take(int64_t{kMaxRows} * K * H * 4));
  s.ys = reinterpret_cast<float*>(take(int64_t{kMaxRows} * H * 4));
  if (total != nullptr) *total = off;
  return s;
}

// Block-wide argmax of (v, i) under "greater v, then lower i"; every thread gets the winner.
__device__ void block_argmax(float v, int i, float* sv, int* si, float* out_v, int* out_i) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float v2 = __shfl_xor_sync(0xffffffffu, v, off);
    const int i2 = __shfl_xor_sync(0xffffffffu, i, off);
    if (v2 > v || (v2 == v && i2 < i)) {
      v = v2;
      i = i2;
    }
  }
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  __syncthreads();
  if (lane == 0) {
    sv[warp] = v;
    si[warp] = i;
  }
  __syncthreads();
  float bv = sv[0];
  int bi = si[0];
  for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) {
    if (sv[w] > bv || (sv[w] == bv && si[w] < bi)) {
      bv = sv[w];
      bi = si[w];
    }
  }
  *out_v = bv;
  *out_i = bi;
}

// One block of blockDim >= E threads (a multiple of 32, at most 1024): thread e handles expert e.
__global__ void __launch_bounds__(1024) moe_route_kernel(int E, int K, int rows, int norm, MoeScratch s) {
  __shared__ float red[32];
  __shared__ float sv[32];
  __shared__ int si[32];
  __shared__ int s_sel[kMaxTopK];
  __shared__ float s_p[kMaxTopK];
  __shared__ int s_scan[32];
  const int e = static_cast<int>(threadIdx.x);
  for (int r = 0; r < rows; ++r) {
    const float l = e < E ? s.logits[r * E + e] : -INFINITY;
    const float m = block_max(l, red);
    const float pe = e < E ? expf(l - m) : 0.0f;
    const float sum = block_sum(pe, red);
    const float p = pe / sum;
    bool chosen = false;
    for (int i = 0; i < K; ++i) {
      float wv;
      int wi;
      block_argmax(e < E && !chosen ? p : -1.0f, e, sv, si, &wv, &wi);
      if (e == wi) chosen = true;
      if (threadIdx.x == 0) {
        s_sel[i] = wi;
        s_p[i] = wv;
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float top = 0.0f;
      for (int i = 0; i < K; ++i) top += s_p[i];
      int ids[kMaxTopK];
      float ws[kMaxTopK];
      for (int i = 0; i < K; ++i) {
        // Insertion by ascending id: the order in which the combine step sums.
        const int id = s_sel[i];
        const float w = norm != 0 ? s_p[i] / top : s_p[i];
        int at = i;
        while (at > 0 && ids[at - 1] > id) {
          ids[at] = ids[at - 1];
          ws[at] = ws[at - 1];
          --at;
        }
        ids[at] = id;
        ws[at] = w;
      }
      for (int i = 0; i < K; ++i) {
        s.sel[r * K + i] = ids[i];
        s.wts[r * K + i] = ws[i];
      }
    }
    __syncthreads();
  }
  // Slots and the ascending list of used experts (exclusive scan of the "used" flags).
  int flag = 0;
  if (e < E) {
    for (int r = 0; r < kMaxRows; ++r) {
      int slot = -1;
      if (r < rows) {
        for (int i = 0; i < K; ++i) {
          if (s.sel[r * K + i] == e) slot = i;
        }
      }
      s.slot_of[e * kMaxRows + r] = slot;
      if (slot >= 0) flag = 1;
    }
  }
  const int warp = e >> 5, lane = e & 31;
  int incl = flag;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += y;
  }
  if (lane == 31) s_scan[warp] = incl;
  __syncthreads();
  int before = 0;
  for (int w = 0; w < warp; ++w) before += s_scan[w];
  if (flag != 0) s.used[before + incl - 1] = e;
  if (e == static_cast<int>(blockDim.x) - 1) *s.count = before + incl;
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

// blockIdx.x: used-expert slot u (< umax) or umax for the shared expert; blockIdx.y: 8 output rows, one
// per warp.
__global__ void __launch_bounds__(kBlock)
    moe_up_kernel(MoeLaunch m, const float* x, int64_t xs, int rows, int umax, MoeScratch s) {
  const int u = static_cast<int>(blockIdx.x);
  const bool shared = u == umax;
  int e = 0;
  if (!shared) {
    if (u >= *s.count) return;
    e = s.used[u];
  }
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t n = static_cast<int64_t>(blockIdx.y) * (kBlock / 32) + (threadIdx.x >> 5);
  const int64_t width = shared ? m.shared_inter : m.inter;
  if (n >= width) return;
  int slot[kMaxRows];
  uint32_t mask = 0;
  const float* xr[kMaxRows];
#pragma unroll
  for (int r = 0; r < kMaxRows; ++r) {
    slot[r] = r < rows ? (shared ? 0 : s.slot_of[e * kMaxRows + r]) : -1;
    if (slot[r] >= 0) mask |= 1u << r;
    xr[r] = x + r * xs;
  }
  const DevMatrix& gm = shared ? m.sh_gate : m.gate;
  const DevMatrix& um = shared ? m.sh_up : m.up;
  float ga[kMaxRows] = {}, ua[kMaxRows] = {};
  const void *d, *sc, *b;
  expert_ptrs(gm, shared ? 0 : e, &d, &sc, &b);
  dot_rows_any<true>(gm, d, sc, b, n, xr, mask, lane, ga);
  expert_ptrs(um, shared ? 0 : e, &d, &sc, &b);
  dot_rows_any<true>(um, d, sc, b, n, xr, mask, lane, ua);
  warp_sum_rows(ga, rows);
  warp_sum_rows(ua, rows);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r) {
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

__global__ void __launch_bounds__(kBlock) moe_down_kernel(MoeLaunch m, int rows, int umax, MoeScratch s) {
  const int u = static_cast<int>(blockIdx.x);
  const bool shared = u == umax;
  int e = 0;
  if (!shared) {
    if (u >= *s.count) return;
    e = s.used[u];
  }
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t n = static_cast<int64_t>(blockIdx.y) * (kBlock / 32) + (threadIdx.x >> 5);
  if (n >= m.hidden) return;
  int slot[kMaxRows];
  uint32_t mask = 0;
  const float* xr[kMaxRows];
#pragma unroll
  for (int r = 0; r < kMaxRows; ++r) {
    slot[r] = r < rows ? (shared ? 0 : s.slot_of[e * kMaxRows + r]) : -1;
    if (slot[r] >= 0) mask |= 1u << r;
    xr[r] = shared ? s.sact + static_cast<int64_t>(r) * m.shared_inter
                   : s.act + (static_cast<int64_t>(r) * m.top_k + (slot[r] < 0 ? 0 : slot[r])) * m.inter;
  }
  const DevMatrix& dm = shared ? m.sh_down : m.down;
  float acc[kMaxRows] = {};
  const void *d, *sc, *b;
  expert_ptrs(dm, shared ? 0 : e, &d, &sc, &b);
  dot_rows_any<true>(dm, d, sc, b, n, xr, mask, lane, acc);
  warp_sum_rows(acc, rows);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r) {
      if ((mask >> r) & 1u) {
        if (shared) {
          s.ys[r * m.hidden + n] = acc[r];
        } else {
          s.y[(static_cast<int64_t>(r) * m.top_k + slot[r]) * m.hidden + n] = acc[r];
        }
      }
    }
  }
}

__global__ void moe_combine_kernel(MoeLaunch m, int r0, int rows, MoeScratch s) {
  const int64_t total = static_cast<int64_t>(rows) * m.hidden;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(i / m.hidden);
    const int64_t n = i % m.hidden;
    float acc = 0.0f;
    for (int k = 0; k < m.top_k; ++k) {
      acc = acc + s.y[(static_cast<int64_t>(r) * m.top_k + k) * m.hidden + n] * s.wts[r * m.top_k + k];
    }
    m.out[(r0 + r) * m.out_stride + n] = acc + sigmoidf_(s.sg[r]) * s.ys[r * m.hidden + n];
  }
}

// ---- Wide steps (prefill, R > kMaxRows): passes of up to kMoeWideRows rows through tiled products ----
// route per row (the decode route's arithmetic, one block per row), then per expert the ascending list of
// (row, slot) entries that selected it; gate/up and down as tiled products over each expert's entries; the
// decode combine. Each expert's weights are read once per kTileRows of its entries.
constexpr int kMoeWideRows = 256;

struct MoeWide {
  MoeScratch s;  // logits/sg/sel/wts/act/sact/y/ys sized for kMoeWideRows rows
  int* count;    // [E]: entries per expert
  int* list;     // [E][kMoeWideRows]: entry r * K + slot, ascending r
};

MoeWide carve_wide(void* base, int E, int K, int H, int I, int Is, int64_t* total) {
  uint8_t* p = static_cast<uint8_t*>(base);
  int64_t off = 0;
  auto take = [&](int64_t bytes) {
    uint8_t* q = p == nullptr ? nullptr : p + off;
    off += align256(bytes);
    return q;
  };
  const int64_t B = kMoeWideRows;
  MoeWide w{};
  w.s.logits = reinterpret_cast<float*>(take(B * E * 4));
  w.s.sg = reinterpret_cast<float*>(take(B * 4));
  w.s.sel = reinterpret_cast<int*>(take(B * K * 4));
  w.s.wts = reinterpret_cast<float*>(take(B * K * 4));
  w.s.act = reinterpret_cast<float*>(take(B * K * I * 4));
  w.s.sact = reinterpret_cast<float*>(take(B * Is * 4));
  w.s.y = reinterpret_cast<float*>(take(B * K * H * 4));
  w.s.ys = reinterpret_cast<float*>(take(B * H * 4));
  w.count = reinterpret_cast<int*>(take(int64_t{E} * 4));
  w.list = reinterpret_cast<int*>(take(int64_t{E} * B * 4));
  if (total != nullptr) *total = off;
  return w;
}

// One block per row, blockDim >= E: the same softmax / top-k / renormalisation / id sort as moe_route_kernel.
__global__ void __launch_bounds__(1024) moe_route_rows_kernel(int E, int K, int norm, MoeScratch s) {
  __shared__ float red[32];
  __shared__ float sv[32];
  __shared__ int si[32];
  __shared__ int s_sel[kMaxTopK];
  __shared__ float s_p[kMaxTopK];
  const int e = static_cast<int>(threadIdx.x);
  const int r = static_cast<int>(blockIdx.x);
  const float l = e < E ? s.logits[static_cast<int64_t>(r) * E + e] : -INFINITY;
  const float m = block_max(l, red);
  const float pe = e < E ? expf(l - m) : 0.0f;
  const float sum = block_sum(pe, red);
  const float p = pe / sum;
  bool chosen = false;
  for (int i = 0; i < K; ++i) {
    float wv;
    int wi;
    block_argmax(e < E && !chosen ? p : -1.0f, e, sv, si, &wv, &wi);
    if (e == wi) chosen = true;
    if (threadIdx.x == 0) {
      s_sel[i] = wi;
      s_p[i] = wv;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float top = 0.0f;
    for (int i = 0; i < K; ++i) top += s_p[i];
    int ids[kMaxTopK];
    float ws[kMaxTopK];
    for (int i = 0; i < K; ++i) {
      const int id = s_sel[i];
      const float w = norm != 0 ? s_p[i] / top : s_p[i];
      int at = i;
      while (at > 0 && ids[at - 1] > id) {
        ids[at] = ids[at - 1];
        ws[at] = ws[at - 1];
        --at;
      }
      ids[at] = id;
      ws[at] = w;
    }
    for (int i = 0; i < K; ++i) {
      s.sel[r * K + i] = ids[i];
      s.wts[r * K + i] = ws[i];
    }
  }
}

// One thread per expert: its entries in ascending row order.
__global__ void moe_bucket_kernel(int E, int K, int rows, MoeWide w) {
  const int e = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (e >= E) return;
  int n = 0;
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < K; ++i) {
      if (w.s.sel[r * K + i] == e) w.list[static_cast<int64_t>(e) * kMoeWideRows + n++] = r * K + i;
    }
  }
  w.count[e] = n;
}

void run_moe_wide(const MoeLaunch& m, cudaStream_t stream) {
  const MoeWide w = carve_wide(m.scratch, m.experts, m.top_k, m.hidden, m.inter, m.shared_inter, nullptr);
  const int route_threads = m.experts <= 32 ? 32 : (m.experts + 31) / 32 * 32;
  for (int r0 = 0; r0 < m.rows; r0 += kMoeWideRows) {
    const int n = m.rows - r0 < kMoeWideRows ? m.rows - r0 : kMoeWideRows;
    const float* x = m.x + r0 * m.x_stride;
    TileJob j;
    j.x = x;
    j.xs = m.x_stride;
    j.rows = n;
    j.w = m.router;
    j.out = w.s.logits;
    j.os = m.experts;
    launch_tiled(j, 1, n, stream);
    j.w = m.shared_gate;
    j.out = w.s.sg;
    j.os = 1;
    launch_tiled(j, 1, n, stream);
    moe_route_rows_kernel<<<n, route_threads, 0, stream>>>(m.experts, m.top_k, m.norm_topk ? 1 : 0, w.s);
    moe_bucket_kernel<<<grid_for(m.experts, 128), 128, 0, stream>>>(m.experts, m.top_k, n, w);
    // Routed experts: gate/up into act[entry], then down into y[entry].
    TileJob up;
    up.w = m.gate;
    up.w2 = m.up;
    up.dual = 1;
    up.x = x;
    up.xs = m.x_stride;
    up.list = w.list;
    up.list_stride = kMoeWideRows;
    up.list_div = m.top_k;
    up.count = w.count;
    up.out = w.s.act;
    up.os = m.inter;
    launch_tiled(up, m.experts, n, stream);
    TileJob dn;
    dn.w = m.down;
    dn.x = w.s.act;
    dn.xs = m.inter;
    dn.list = w.list;
    dn.list_stride = kMoeWideRows;
    dn.list_div = 1;
    dn.count = w.count;
    dn.out = w.s.y;
    dn.os = m.hidden;
    launch_tiled(dn, m.experts, n, stream);
    // The shared expert over all rows.
    TileJob su;
    su.w = m.sh_gate;
    su.w2 = m.sh_up;
    su.dual = 1;
    su.x = x;
    su.xs = m.x_stride;
    su.rows = n;
    su.out = w.s.sact;
    su.os = m.shared_inter;
    launch_tiled(su, 1, n, stream);
    TileJob sd;
    sd.w = m.sh_down;
    sd.x = w.s.sact;
    sd.xs = m.shared_inter;
    sd.rows = n;
    sd.out = w.s.ys;
    sd.os = m.hidden;
    launch_tiled(sd, 1, n, stream);
    const int64_t total = static_cast<int64_t>(n) * m.hidden;
    const unsigned blocks = grid_for(total, kBlock) < 4096 ? grid_for(total, kBlock) : 4096;
    moe_combine_kernel<<<blocks, kBlock, 0, stream>>>(m, r0, n, w.s);
  }
}

}  // namespace

int64_t moe_scratch_bytes(int experts, int top_k, int hidden, int inter, int shared_inter) {
  int64_t total = 0, wide = 0;
  carve(nullptr, experts, top_k, hidden, inter, shared_inter, &total);
  carve_wide(nullptr, experts, top_k, hidden, inter, shared_inter, &wide);
  return total > wide ? total : wide;
}

namespace {

// Runs the MoE block; when ev is not null, records ev[0..5] between its phases.
void run_moe(const MoeLaunch& m, cudaStream_t stream, cudaEvent_t* ev) {
  const MoeScratch s = carve(m.scratch, m.experts, m.top_k, m.hidden, m.inter, m.shared_inter, nullptr);
  const int up_width = m.inter > m.shared_inter ? m.inter : m.shared_inter;
  // The router block: one thread per expert (fewer warps, shorter fixed-order reductions).
  const int route_threads = m.experts <= 32 ? 32 : (m.experts + 31) / 32 * 32;
  auto mark = [&](int i) {
    if (ev != nullptr) cudaEventRecord(ev[i], stream);
  };
  for (int r0 = 0; r0 < m.rows; r0 += kMaxRows) {
    const int n = m.rows - r0 < kMaxRows ? m.rows - r0 : kMaxRows;
    const float* x = m.x + r0 * m.x_stride;
    mark(0);
    launch_gemv(m.router, x, m.x_stride, s.logits, m.experts, n, false, stream);
    launch_gemv(m.shared_gate, x, m.x_stride, s.sg, 1, n, false, stream);
    mark(1);
    moe_route_kernel<<<1, route_threads, 0, stream>>>(m.experts, m.top_k, n, m.norm_topk ? 1 : 0, s);
    mark(2);
    const int umax = n * m.top_k < m.experts ? n * m.top_k : m.experts;
    moe_up_kernel<<<dim3(umax + 1, grid_for(up_width, kBlock / 32)), kBlock, 0, stream>>>(m, x, m.x_stride, n,
                                                                                          umax, s);
    mark(3);
    moe_down_kernel<<<dim3(umax + 1, grid_for(m.hidden, kBlock / 32)), kBlock, 0, stream>>>(m, n, umax, s);
    mark(4);
    const int64_t total = static_cast<int64_t>(n) * m.hidden;
    const unsigned blocks = grid_for(total, kBlock) < 1024 ? grid_for(total, kBlock) : 1024;
    moe_combine_kernel<<<blocks, kBlock, 0, stream>>>(m, r0, n, s);
    mark(5);
  }
}

}  // namespace

void launch_moe(const MoeLaunch& m, cudaStream_t stream) {
  if (m.rows > kMaxRows) {
    run_moe_wide(m, stream);
    return;
  }
  run_moe(m, stream, nullptr);
}

void launch_moe_profiled(const MoeLaunch& m, cudaStream_t stream, double ms[5]) {
  for (int r0 = 0; r0 < m.rows; r0 += kMaxRows) {
    MoeLaunch chunk = m;
    chunk.x = m.x + r0 * m.x_stride;
    chunk.out = m.out + r0 * m.out_stride;
    chunk.rows = m.rows - r0 < kMaxRows ? m.rows - r0 : kMaxRows;
    cudaEvent_t ev[6];
    for (cudaEvent_t& e : ev) cudaEventCreate(&e);
    run_moe(chunk, stream, ev);
    cudaEventSynchronize(ev[5]);
    for (int i = 0; i < 5; ++i) {
      float t = 0;
      cudaEventElapsedTime(&t, ev[i], ev[i + 1]);
      ms[i] += t;
    }
    for (cudaEvent_t& e : ev) cudaEventDestroy(e);
  }
}

}  // namespace pd::cuda
