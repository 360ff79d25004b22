// Dense CUDA ops: matrix-vector products over up to kMaxRows rows (weights read once for all rows), embedding
// lookup, RMSNorm, add, argmax.
#include "puredrive/backend/cuda/common.cuh"

namespace pd::cuda {
namespace {

// One warp per output column n at a time (grid-stride over columns), lanes over 8-column chunks of the
// weight row, a warp butterfly at the end: no shared memory and no block barrier, so each block streams many
// weight rows instead of paying a reduction per few kilobytes.
template <int FMT, int BITS, bool VEC>
__global__ void __launch_bounds__(kBlock)
    gemv_kernel(DevMatrix m, const float* x, int64_t xs, float* out, int64_t os, int rows, int accumulate) {
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * (kBlock / 32);
  const float* xr[kMaxRows];
#pragma unroll
  for (int r = 0; r < kMaxRows; ++r) xr[r] = x + r * xs;
  const uint32_t mask = (1u << rows) - 1u;
  for (int64_t n = static_cast<int64_t>(blockIdx.x) * (kBlock / 32) + warp; n < m.rows; n += stride) {
    float acc[kMaxRows] = {};
    dot_rows<FMT, BITS, VEC>(m, m.data, m.scales, m.biases, n, xr, mask, lane, acc);
    warp_sum_rows(acc, rows);
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kMaxRows; ++r) {
        if (r < rows) {
          float* o = out + r * os + n;
          *o = accumulate != 0 ? *o + acc[r] : acc[r];
        }
      }
    }
  }
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

template <bool VEC>
void gemv_dispatch(const DevMatrix& w, const float* x, int64_t xs, float* out, int64_t os, int rows,
                   int accumulate, cudaStream_t stream) {
  const dim3 grid(gemv_blocks(w.rows));
#define PD_GEMV(F, B) gemv_kernel<F, B, VEC><<<grid, kBlock, 0, stream>>>(w, x, xs, out, os, rows, accumulate)
  switch (w.fmt) {
    case WFmt::kF32:
      PD_GEMV(0, 0);
      return;
    case WFmt::kF16:
      PD_GEMV(1, 0);
      return;
    case WFmt::kBF16:
      PD_GEMV(2, 0);
      return;
    case WFmt::kAffine:
      switch (w.bits) {
        case 2:
          PD_GEMV(3, 2);
          return;
        case 3:
          PD_GEMV(3, 3);
          return;
        case 4:
          PD_GEMV(3, 4);
          return;
        case 5:
          PD_GEMV(3, 5);
          return;
        case 6:
          PD_GEMV(3, 6);
          return;
        case 7:
          PD_GEMV(3, 7);
          return;
        default:
          PD_GEMV(3, 8);
          return;
      }
  }
#undef PD_GEMV
}

__device__ void load_w8_any(const DevMatrix& m, int64_t n, int64_t c, float w[8]) {
  switch (m.fmt) {
    case WFmt::kF32:
      load_w8<0, 0>(m, m.data, m.scales, m.biases, n, c, w);
      return;
    case WFmt::kF16:
      load_w8<1, 0>(m, m.data, m.scales, m.biases, n, c, w);
      return;
    case WFmt::kBF16:
      load_w8<2, 0>(m, m.data, m.scales, m.biases, n, c, w);
      return;
    case WFmt::kAffine:
      switch (m.bits) {
        case 2:
          load_w8<3, 2>(m, m.data, m.scales, m.biases, n, c, w);
          return;
        case 3:
          load_w8<3, 3>(m, m.data, m.scales, m.biases, n, c, w);
          return;
        case 4:
          load_w8<3, 4>(m, m.data, m.scales, m.biases, n, c, w);
          return;
        case 5:
          load_w8<3, 5>(m, m.data, m.scales, m.biases, n, c, w);
          return;
        case 6:
          load_w8<3, 6>(m, m.data, m.scales, m.biases, n, c, w);
          return;
        case 7:
          load_w8<3, 7>(m, m.data, m.scales, m.biases, n, c, w);
          return;
        default:
          load_w8<3, 8>(m, m.data, m.scales, m.biases, n, c, w);
          return;
      }
  }
}

// Out-of-range token ids give a zero row (the model validates ids before upload).
__global__ void embed_kernel(DevMatrix table, const int32_t* tokens, int64_t ts, float* out, int64_t os) {
  const int r = static_cast<int>(blockIdx.x);
  const int32_t id = tokens[r * ts];
  float* o = out + r * os;
  const int64_t chunks = table.cols / 8;
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    float w[8] = {};
    if (id >= 0 && id < table.rows) load_w8_any(table, id, c, w);
#pragma unroll
    for (int j = 0; j < 8; ++j) o[c * 8 + j] = w[j];
  }
}

// out = (x * rsqrt(mean(x^2) + eps)) * w, the mean as a fixed-order sum / n; out may alias x (each thread
// rewrites only the elements it read).
__global__ void rms_norm_kernel(const float* x, int64_t xs, const float* w, int n, float eps, float* out,
                                int64_t os) {
  __shared__ float red[32];
  const float* xr = x + blockIdx.x * xs;
  float* o = out + blockIdx.x * os;
  float s = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s = fmaf(xr[i], xr[i], s);
  const float total = block_sum(s, red);
  const float inv = 1.0f / sqrtf(total / static_cast<float>(n) + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = (xr[i] * inv) * w[i];
}

__global__ void add_kernel(const float* a, int64_t as, const float* b, int64_t bs, float* out, int64_t os,
                           int rows, int n) {
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

}  // namespace

void launch_gemv(const DevMatrix& w, const float* x, int64_t xs, float* out, int64_t os, int rows,
                 bool accumulate, cudaStream_t stream) {
  const bool vec = (reinterpret_cast<uintptr_t>(x) % 16 == 0) && (xs % 4 == 0);
  for (int r0 = 0; r0 < rows; r0 += kMaxRows) {
    const int n = rows - r0 < kMaxRows ? rows - r0 : kMaxRows;
    if (vec) {
      gemv_dispatch<true>(w, x + r0 * xs, xs, out + r0 * os, os, n, accumulate ? 1 : 0, stream);
    } else {
      gemv_dispatch<false>(w, x + r0 * xs, xs, out + r0 * os, os, n, accumulate ? 1 : 0, stream);
    }
  }
}

void launch_embed(const DevMatrix& table, const int32_t* tokens, int64_t ts, float* out, int64_t os, int rows,
                  cudaStream_t stream) {
  embed_kernel<<<rows, kBlock, 0, stream>>>(table, tokens, ts, out, os);
}

void launch_rms_norm(const float* x, int64_t xs, const float* w, int n, float eps, float* out, int64_t os,
                     int rows, cudaStream_t stream) {
  rms_norm_kernel<<<rows, kBlock, 0, stream>>>(x, xs, w, n, eps, out, os);
}

void launch_add(const float* a, int64_t as, const float* b, int64_t bs, float* out, int64_t os, int rows,
                int n, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(rows) * n;
  const unsigned blocks = grid_for(total, kBlock) < 1024 ? grid_for(total, kBlock) : 1024;
  add_kernel<<<blocks, kBlock, 0, stream>>>(a, as, b, bs, out, os, rows, n);
}

void launch_argmax(const float* x, int64_t xs, int n, int32_t* out, int64_t os, int rows,
                   cudaStream_t stream) {
  argmax_kernel<<<rows, 1024, 0, stream>>>(x, xs, n, out, os);
}

}  // namespace pd::cuda
