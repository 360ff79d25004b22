// Dense CUDA ops: matrix-vector products over up to kMaxRows rows (weights read once for all rows), embedding
// lookup, RMSNorm, add, argmax.
#include "puredrive/backend/cuda/common.cuh"
#include "puredrive/backend/cuda/gemv_mma.h"
#include "puredrive/backend/cuda/trace.cuh"

namespace pd::cuda {
namespace {

// One warp per output column n at a time (grid-stride over columns), lanes over 8-column chunks of the
// weight row, a warp butterfly at the end: no shared memory and no block barrier, so each block streams many
// weight rows instead of paying a reduction per few kilobytes.
template <int FMT, int BITS, bool VEC, int NR>
__global__ void __launch_bounds__(kBlock)
    gemv_kernel(DevMatrix m, const float* x, int64_t xs, float* out, int64_t os, int rows, bool accumulate) {
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * (kBlock / 32);
  const float* xr[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) xr[r] = x + r * xs;
  const uint32_t mask = (1u << rows) - 1u;
  pdl_launch_dependents();
  const int64_t first = static_cast<int64_t>(blockIdx.x) * (kBlock / 32) + warp;
  if (first < m.rows) prefetch_row_l2(m, m.data, first, lane);
  pdl_wait();
  for (int64_t n = first; n < m.rows; n += stride) {
    float acc[NR] = {};
    dot_rows<FMT, BITS, VEC, NR>(m, m.data, m.scales, m.biases, n, xr, mask, lane, acc);
    warp_sum_rows<NR>(acc, rows);
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        if (r < rows) {
          float* o = out + r * os + n;
          *o = accumulate ? *o + acc[r] : acc[r];
        }
      }
    }
  }
}

template <int FMT, int BITS, bool VEC, int NR>
__global__ void __launch_bounds__(kBlock)
    gemv_multi_kernel(const __grid_constant__ GemvMulti g, const float* x, int64_t xs, int rows) {
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * (kBlock / 32);
  const float* xr[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) xr[r] = x + r * xs;
  const uint32_t mask = (1u << rows) - 1u;
  const int64_t total = g.end[g.count - 1];
  pdl_launch_dependents();
  const int64_t first = static_cast<int64_t>(blockIdx.x) * (kBlock / 32) + warp;
  if (first < total) {
    int i = 0;
    while (first >= g.end[i]) ++i;
    prefetch_row_l2(g.m[i], g.m[i].data, i == 0 ? first : first - g.end[i - 1], lane);
  }
  pdl_wait();
  for (int64_t n = first; n < total; n += stride) {
    int i = 0;
    while (n >= g.end[i]) ++i;
    const int64_t local = i == 0 ? n : n - g.end[i - 1];
    const DevMatrix& m = g.m[i];
    float acc[NR] = {};
    dot_rows<FMT, BITS, VEC, NR>(m, m.data, m.scales, m.biases, local, xr, mask, lane, acc);
    warp_sum_rows<NR>(acc, rows);
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        if (r < rows) g.out[i][r * g.os[i] + local] = acc[r];
      }
    }
  }
}

// Rows of one matrix (gemv) or of several stacked ones (gemv_multi) as one sequence of weight rows.
struct OneMatrix {
  const DevMatrix* m;
  float* out;
  int64_t os;
  bool accumulate;
  __device__ int64_t total() const { return m->rows; }
  __device__ const DevMatrix& at(int64_t n, int64_t* local, float** o, int64_t* ostride) const {
    *local = n;
    *o = out;
    *ostride = os;
    return *m;
  }
};

struct StackedMatrices {
  const GemvMulti* g;
  bool accumulate;
  __device__ int64_t total() const { return g->end[g->count - 1]; }
  __device__ const DevMatrix& at(int64_t n, int64_t* local, float** o, int64_t* ostride) const {
    int i = 0;
    while (n >= g->end[i]) ++i;
    *local = i == 0 ? n : n - g->end[i - 1];
    *o = g->out[i];
    *ostride = g->os[i];
    return g->m[i];
  }
};

// Persistent form, for one-row steps of 16-bit weights: a resident grid, each warp streams its weight rows in
// steps of kBatch chunks per lane, and the loads of step s + 1 are issued before the products of step s, so a
// warp always has a step in flight (H200, 35B bf16: 277 -> 292 tok/s; slower for affine weights, whose
// decode needs the registers, and for verify steps). Same lane-chunk order as dot_rows: bitwise the same
// results as gemv_kernel.
template <int FMT, int BITS, bool VEC, int NR, typename Rows>
__device__ __forceinline__ void gemv_pipe(const Rows& rows_of, const float* x, int64_t xs, int rows) {
  constexpr int kBatch = dot_batch<FMT>();
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * (kBlock / 32);
  const int64_t total = rows_of.total();
  const float* xr[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) xr[r] = x + r * xs;
  const uint32_t mask = (1u << rows) - 1u;
  int64_t n = static_cast<int64_t>(blockIdx.x) * (kBlock / 32) + warp;
  pdl_launch_dependents();
  pdl_wait();
  if (n >= total) return;
  int64_t local;
  float* out;
  int64_t os;
  const DevMatrix* m = &rows_of.at(n, &local, &out, &os);
  const int64_t chunks = m->cols / 8;
  const int steps = static_cast<int>((chunks + 32 * kBatch - 1) / (32 * kBatch));
  auto load = [&](const DevMatrix& mm, int64_t row, int step, RawW8 raw[kBatch]) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t c = lane + 32 * (static_cast<int64_t>(step) * kBatch + u);
      if (c < chunks) raw[u] = load_raw8<FMT, BITS>(mm, mm.data, mm.scales, mm.biases, row, c);
    }
  };
  RawW8 next[kBatch];
  load(*m, local, 0, next);
  int step = 0;
  float acc[NR] = {};
  while (true) {
    RawW8 cur[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) cur[u] = next[u];
    const int64_t cl = local;
    float* co = out;
    const int64_t cos = os;
    const int cs = step;
    bool more = true;
    if (++step == steps) {
      step = 0;
      n += stride;
      more = n < total;
      if (more) m = &rows_of.at(n, &local, &out, &os);
    }
    if (more) load(*m, local, step, next);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t c = lane + 32 * (static_cast<int64_t>(cs) * kBatch + u);
      if (c >= chunks) break;
      fma_chunk<FMT, BITS, NR, VEC>(cur[u], xr, c, mask, acc);
    }
    if (cs == steps - 1) {
      warp_sum_rows<NR>(acc, rows);
      if (lane == 0) {
#pragma unroll
        for (int r = 0; r < NR; ++r) {
          if (r < rows) {
            float* p = co + r * cos + cl;
            *p = rows_of.accumulate ? *p + acc[r] : acc[r];
          }
        }
      }
#pragma unroll
      for (int r = 0; r < NR; ++r) acc[r] = 0.0f;
    }
    if (!more) break;
  }
}

template <int FMT, int BITS, bool VEC, int NR>
__global__ void __launch_bounds__(kBlock)
    gemv_pipe_kernel(DevMatrix m, const float* x, int64_t xs, float* out, int64_t os, int rows,
                     bool accumulate) {
  gemv_pipe<FMT, BITS, VEC, NR>(OneMatrix{&m, out, os, accumulate}, x, xs, rows);
}

template <int FMT, int BITS, bool VEC, int NR>
__global__ void __launch_bounds__(kBlock)
    gemv_multi_pipe_kernel(const __grid_constant__ GemvMulti g, const float* x, int64_t xs, int rows) {
  gemv_pipe<FMT, BITS, VEC, NR>(StackedMatrices{&g, false}, x, xs, rows);
}

template <int FMT, int NR>
constexpr bool use_pipe() {
  return NR == 1 && (FMT == static_cast<int>(WFmt::kBF16) || FMT == static_cast<int>(WFmt::kF16));
}

// Blocks for n output columns: enough to fill the device a few times over, then grid-stride.
unsigned gemv_blocks(int64_t n) {
  static const int cap = [] {
    int dev = 0, sms = 132;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      cudaGetLastError();
      sms = 132;
    }
    return sms * 16;
  }();
  const int64_t want = (n + kBlock / 32 - 1) / (kBlock / 32);
  return static_cast<unsigned>(want < cap ? want : cap);
}

bool aligned_rows(const float* x, int64_t xs) {
  return (reinterpret_cast<uintptr_t>(x) % 16 == 0) && (xs % 4 == 0);
}

// Out-of-range token ids give a zero row (the model validates ids before upload).
__global__ void embed_kernel(DevMatrix table, const int32_t* tokens, int64_t ts, float* out, int64_t os) {
  PD_TRACE_SCOPE(kEmbed, gridDim.x);
  pdl_enter();
  PD_TRACE_STAMP(0);
  const int r = static_cast<int>(blockIdx.x);
  const int32_t id = tokens[r * ts];
  float* o = out + r * os;
  const int64_t chunks = table.cols / 8;
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    float w[8] = {};
    if (id >= 0 && id < table.rows) load_w8_any(table, table.data, table.scales, table.biases, id, c, w);
#pragma unroll
    for (int j = 0; j < 8; ++j) o[c * 8 + j] = w[j];
  }
}

// out = (x * rsqrt(mean(x^2) + eps)) * w, the mean as a fixed-order sum / n; out may alias x (each thread
// rewrites only the elements it read). Rows of up to kNormRegs * blockDim elements stay in registers between
// the two passes (one round of loads, issued together with the weights').
constexpr int kNormRegs = 8;

__global__ void rms_norm_kernel(const float* x, int64_t xs, const float* w, int n, float eps, float* out,
                                int64_t os) {
  PD_TRACE_SCOPE(kRmsNorm, gridDim.x);
  pdl_enter();
  PD_TRACE_STAMP(0);
  __shared__ float red[32];
  const float* xr = x + blockIdx.x * xs;
  float* o = out + blockIdx.x * os;
  const int step = static_cast<int>(blockDim.x);
  if (n <= kNormRegs * step) {
    float v[kNormRegs], wv[kNormRegs];
#pragma unroll
    for (int j = 0; j < kNormRegs; ++j) {
      const int i = static_cast<int>(threadIdx.x) + j * step;
      v[j] = i < n ? xr[i] : 0.0f;
      wv[j] = i < n ? w[i] : 0.0f;
    }
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < kNormRegs; ++j) {
      if (static_cast<int>(threadIdx.x) + j * step < n) s = fmaf(v[j], v[j], s);
    }
    const float inv = rms_inverse(block_sum(s, red), n, eps);
#pragma unroll
    for (int j = 0; j < kNormRegs; ++j) {
      const int i = static_cast<int>(threadIdx.x) + j * step;
      if (i < n) o[i] = (v[j] * inv) * wv[j];
    }
    return;
  }
  float s = 0.0f;
  for (int i = threadIdx.x; i < n; i += step) s = fmaf(xr[i], xr[i], s);
  const float inv = rms_inverse(block_sum(s, red), n, eps);
  for (int i = threadIdx.x; i < n; i += step) o[i] = (xr[i] * inv) * w[i];
}

__global__ void add_kernel(const float* a, int64_t as, const float* b, int64_t bs, float* out, int64_t os,
                           int rows, int n) {
  pdl_enter();
  const int64_t total = static_cast<int64_t>(rows) * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / n, c = i % n;
    out[r * os + c] = a[r * as + c] + b[r * bs + c];
  }
}

// (value, index) pairs under "greater value, then lower index"; NaN never wins.
__device__ __forceinline__ void argmax_merge(float& v, int& i, float v2, int i2) {
  if (v2 > v || (v2 == v && i2 < i)) {
    v = v2;
    i = i2;
  }
}

__global__ void argmax_kernel(const float* x, int64_t xs, int n, int32_t* out, int64_t os) {
  pdl_enter();
  __shared__ float sv[32];
  __shared__ int si[32];
  const float* xr = x + blockIdx.x * xs;
  float v = -INFINITY;
  int idx = n;  // sentinel: nothing found yet
#pragma unroll 8
  for (int i = threadIdx.x; i < n; i += blockDim.x) argmax_merge(v, idx, xr[i], i);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float v2 = __shfl_xor_sync(0xffffffffu, v, off);
    const int i2 = __shfl_xor_sync(0xffffffffu, idx, off);
    argmax_merge(v, idx, v2, i2);
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    sv[warp] = v;
    si[warp] = idx;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) argmax_merge(v, idx, sv[w], si[w]);
    out[blockIdx.x * os] = idx >= n ? 0 : idx;
  }
}

// Wide rows: block b of row r reduces its contiguous slice to one (value, index) pair, then one warp per row
// merges the slices' pairs. The maximum under (value desc, index asc) is order-free, so any split gives the
// one-block result.
constexpr int kArgmaxSliceBlock = 256;

__global__ void __launch_bounds__(kArgmaxSliceBlock)
    argmax_slices_kernel(const float* x, int64_t xs, int n, int slice, float* pv, int* pi) {
  PD_TRACE_SCOPE(kArgmaxSlices, gridDim.y);
  pdl_enter();
  PD_TRACE_STAMP(0);
  __shared__ float sv[32];
  __shared__ int si[32];
  const int r = static_cast<int>(blockIdx.y);
  const float* xr = x + r * xs;
  const int begin = static_cast<int>(blockIdx.x) * slice;
  const int end = begin + slice < n ? begin + slice : n;
  float v = -INFINITY;
  int idx = n;
  for (int i = begin + static_cast<int>(threadIdx.x); i < end; i += kArgmaxSliceBlock)
    argmax_merge(v, idx, xr[i], i);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    argmax_merge(v, idx, __shfl_xor_sync(0xffffffffu, v, off), __shfl_xor_sync(0xffffffffu, idx, off));
  }
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  if (lane == 0) {
    sv[warp] = v;
    si[warp] = idx;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgmaxSliceBlock / 32; ++w) argmax_merge(v, idx, sv[w], si[w]);
    pv[r * gridDim.x + blockIdx.x] = v;
    pi[r * gridDim.x + blockIdx.x] = idx;
  }
}

__global__ void argmax_merge_kernel(const float* pv, const int* pi, int slices, int n, int32_t* out,
                                    int64_t os) {
  PD_TRACE_SCOPE(kArgmaxMerge, gridDim.x);
  pdl_enter();
  PD_TRACE_STAMP(0);
  const int r = static_cast<int>(blockIdx.x);
  const int lane = static_cast<int>(threadIdx.x);
  float v = -INFINITY;
  int idx = n;
  for (int i = lane; i < slices; i += 32) argmax_merge(v, idx, pv[r * slices + i], pi[r * slices + i]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    argmax_merge(v, idx, __shfl_xor_sync(0xffffffffu, v, off), __shfl_xor_sync(0xffffffffu, idx, off));
  }
  if (lane == 0) out[r * os] = idx >= n ? 0 : idx;
}

}  // namespace

int argmax_slices(int n) {
  constexpr int kPerSlice = 8 * kArgmaxSliceBlock;
  const int slices = (n + kPerSlice - 1) / kPerSlice;
  return slices < 1 ? 1 : (slices > 256 ? 256 : slices);
}

void launch_argmax_wide(const float* x, int64_t xs, int n, int32_t* out, int64_t os, int rows, void* scratch,
                        cudaStream_t stream) {
  const int slices = argmax_slices(n);
  const int slice = (n + slices - 1) / slices;
  float* pv = static_cast<float*>(scratch);
  int* pi = reinterpret_cast<int*>(pv + static_cast<int64_t>(rows) * slices);
  PD_TRACE_ENSURE();
  launch_pdl(argmax_slices_kernel, dim3(slices, rows), dim3(kArgmaxSliceBlock), 0, stream, x, xs, n, slice,
             pv, pi);
  launch_pdl(argmax_merge_kernel, dim3(rows), dim3(32), 0, stream, pv, pi, slices, n, out, os);
}

void launch_gemv(const DevMatrix& w, const float* x, int64_t xs, float* out, int64_t os, int rows,
                 bool accumulate, cudaStream_t stream) {
  const bool vec = aligned_rows(x, xs);
  const dim3 grid(gemv_blocks(w.rows));
  for (int r0 = 0; r0 < rows; r0 += kMaxRows) {
    const int n = rows - r0 < kMaxRows ? rows - r0 : kMaxRows;
    const float* xc = x + r0 * xs;
    float* oc = out + r0 * os;
    if (gemv_mma_supported(w)) {
      launch_gemv_mma(w, xc, xs, oc, os, n, accumulate, stream);
      continue;
    }
    with_format(w.fmt, w.bits, [&](auto f) {
      constexpr int F = decltype(f)::kFmt, B = decltype(f)::kBits;
      if (!vec) {
        // Unaligned activations (a column slice): rare, one variant.
        launch_pdl(gemv_kernel<F, B, false, kMaxRows>, grid, dim3(kBlock), 0, stream, w, xc, xs, oc, os, n,
                   accumulate);
        return;
      }
      with_rows_class(n, [&](auto nr) {
        constexpr int NR = decltype(nr)::value;
        if constexpr (use_pipe<F, NR>()) {
          static const unsigned blocks = resident_blocks(gemv_pipe_kernel<F, B, true, NR>);
          const unsigned want = gemv_blocks(w.rows);
          launch_pdl(gemv_pipe_kernel<F, B, true, NR>, dim3(want < blocks ? want : blocks), dim3(kBlock), 0,
                     stream, w, xc, xs, oc, os, n, accumulate);
        } else {
          launch_pdl(gemv_kernel<F, B, true, NR>, grid, dim3(kBlock), 0, stream, w, xc, xs, oc, os, n,
                     accumulate);
        }
      });
    });
  }
}

void launch_gemv_multi(const GemvMulti& g, const float* x, int64_t xs, int rows, cudaStream_t stream) {
  if (gemv_multi_mma_supported(g)) {
    launch_gemv_multi_mma(g, x, xs, rows, stream);
    return;
  }
  if (!aligned_rows(x, xs)) {
    for (int i = 0; i < g.count; ++i) launch_gemv(g.m[i], x, xs, g.out[i], g.os[i], rows, false, stream);
    return;
  }
  const dim3 grid(gemv_blocks(g.end[g.count - 1]));
  with_format(g.m[0].fmt, g.m[0].bits, [&](auto f) {
    with_rows_class(rows, [&](auto nr) {
      constexpr int F = decltype(f)::kFmt, B = decltype(f)::kBits, NR = decltype(nr)::value;
      if constexpr (use_pipe<F, NR>()) {
        static const unsigned blocks = resident_blocks(gemv_multi_pipe_kernel<F, B, true, NR>);
        launch_pdl(gemv_multi_pipe_kernel<F, B, true, NR>, dim3(grid.x < blocks ? grid.x : blocks),
                   dim3(kBlock), 0, stream, g, x, xs, rows);
      } else {
        launch_pdl(gemv_multi_kernel<F, B, true, NR>, grid, dim3(kBlock), 0, stream, g, x, xs, rows);
      }
    });
  });
}

void launch_embed(const DevMatrix& table, const int32_t* tokens, int64_t ts, float* out, int64_t os, int rows,
                  cudaStream_t stream) {
  PD_TRACE_ENSURE();
  launch_pdl(embed_kernel, dim3(rows), dim3(kBlock), 0, stream, table, tokens, ts, out, os);
}

void launch_rms_norm(const float* x, int64_t xs, const float* w, int n, float eps, float* out, int64_t os,
                     int rows, cudaStream_t stream) {
  PD_TRACE_ENSURE();
  launch_pdl(rms_norm_kernel, dim3(rows), dim3(kBlock), 0, stream, x, xs, w, n, eps, out, os);
}

void launch_add(const float* a, int64_t as, const float* b, int64_t bs, float* out, int64_t os, int rows,
                int n, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(rows) * n;
  const unsigned blocks = grid_for(total, kBlock) < 1024 ? grid_for(total, kBlock) : 1024;
  launch_pdl(add_kernel, dim3(blocks), dim3(kBlock), 0, stream, a, as, b, bs, out, os, rows, n);
}

void launch_argmax(const float* x, int64_t xs, int n, int32_t* out, int64_t os, int rows,
                   cudaStream_t stream) {
  launch_pdl(argmax_kernel, dim3(rows), dim3(1024), 0, stream, x, xs, n, out, os);
}

}  // namespace pd::cuda
