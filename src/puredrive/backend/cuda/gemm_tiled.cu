// Tiled matrix products for wide steps (prefill, R > kMaxRows): a block computes a tile of kTileRows
// activation rows x kTileCols weight rows. Each weight tile is decoded once into shared memory and used by
// all rows of the tile, so a weight is read R / kTileRows times per step instead of R / kMaxRows times, and
// the products run from shared memory (4 x 4 outputs per thread). Plain f32 FMAs, columns summed in ascending
// order per output (one accumulator), so the result differs from the decode kernels only by summation order.
#include "puredrive/backend/cuda/common.cuh"

namespace pd::cuda {
namespace {

constexpr int kTK = 32;         // columns per shared-memory stage
constexpr int kTThreads = 256;  // 16 x 16 threads, 4 x 4 outputs each
constexpr int kPad = 4;

static_assert(kTileRows == 64 && kTileCols == 64, "the thread layout assumes 64 x 64 tiles");

struct WPtrs {
  const void* d;
  const void* sc;
  const void* b;
};

__device__ __forceinline__ WPtrs expert_of(const DevMatrix& m, int z, bool per_expert) {
  const int64_t e = per_expert ? z : 0;
  WPtrs p;
  p.d = static_cast<const uint8_t*>(m.data) + e * m.data_stride;
  p.sc = m.scales == nullptr ? nullptr : static_cast<const uint8_t*>(m.scales) + e * m.scale_stride;
  p.b = m.biases == nullptr ? nullptr : static_cast<const uint8_t*>(m.biases) + e * m.scale_stride;
  return p;
}

// Stage kTK columns of kTileCols weight rows starting at n0 into ws[k][n] (zeros outside the matrix).
__device__ __forceinline__ void stage_w(const DevMatrix& m, const WPtrs& p, int64_t n0, int64_t k0,
                                        float (*ws)[kTileCols + kPad]) {
  const int wrow = static_cast<int>(threadIdx.x >> 2), c = static_cast<int>(threadIdx.x & 3);
  const int64_t n = n0 + wrow;
  const int64_t chunk = k0 / 8 + c;
  float w[8] = {};
  if (n < m.rows && chunk * 8 < m.cols) load_w8_any(m, p.d, p.sc, p.b, n, chunk, w);
#pragma unroll
  for (int j = 0; j < 8; ++j) ws[c * 8 + j][wrow] = w[j];
}

template <bool DUAL>
__global__ void __launch_bounds__(kTThreads) tiled_kernel(TileJob j) {
  __shared__ float xs[kTK][kTileRows + kPad];
  __shared__ float ws[kTK][kTileCols + kPad];
  __shared__ float ws2[DUAL ? kTK : 1][kTileCols + kPad];
  __shared__ int src[kTileRows], dst[kTileRows];
  const int z = static_cast<int>(blockIdx.z);
  const bool listed = j.list != nullptr;
  const int cnt = listed ? j.count[z] : j.rows;
  const int row0 = static_cast<int>(blockIdx.y) * kTileRows;
  if (row0 >= cnt) return;  // uniform over the block
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileCols;
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < kTileRows) {
    const int i = row0 + tid;
    int s = -1, d = -1;
    if (i < cnt) {
      const int v = listed ? j.list[static_cast<int64_t>(z) * j.list_stride + i] : i;
      s = listed ? v / j.list_div : v;
      d = v;
    }
    src[tid] = s;
    dst[tid] = d;
  }
  __syncthreads();
  const WPtrs p1 = expert_of(j.w, z, listed);
  WPtrs p2 = p1;
  if constexpr (DUAL) p2 = expert_of(j.w2, z, listed);
  const int tx = tid & 15, ty = tid >> 4;
  float acc[4][4] = {};
  float acc2[DUAL ? 4 : 1][DUAL ? 4 : 1] = {};
  (void)acc2;
  (void)ws2;
  (void)p2;
  const int64_t K = j.w.cols;
  const int xrow = tid >> 2, xc = tid & 3;
  const int xsrc = src[xrow];
  const float* xp = xsrc >= 0 ? j.x + static_cast<int64_t>(xsrc) * j.xs : nullptr;
  for (int64_t k0 = 0; k0 < K; k0 += kTK) {
    stage_w(j.w, p1, n0, k0, ws);
    if constexpr (DUAL) stage_w(j.w2, p2, n0, k0, ws2);
    {
      const int64_t col = k0 + xc * 8;
      float v[8] = {};
      if (xp != nullptr && col < K) {
#pragma unroll
        for (int q = 0; q < 8; ++q) v[q] = xp[col + q];
      }
#pragma unroll
      for (int q = 0; q < 8; ++q) xs[xc * 8 + q][xrow] = v[q];
    }
    __syncthreads();
#pragma unroll 8
    for (int k = 0; k < kTK; ++k) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = xs[k][ty + 16 * i];
#pragma unroll
      for (int q = 0; q < 4; ++q) b[q] = ws[k][tx + 16 * q];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[i][q] = fmaf(a[i], b[q], acc[i][q]);
      }
      if constexpr (DUAL) {
#pragma unroll
        for (int q = 0; q < 4; ++q) b[q] = ws2[k][tx + 16 * q];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
          for (int q = 0; q < 4; ++q) acc2[i][q] = fmaf(a[i], b[q], acc2[i][q]);
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int d = dst[ty + 16 * i];
    if (d < 0) continue;
    float* o = j.out + static_cast<int64_t>(d) * j.os;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int64_t n = n0 + tx + 16 * q;
      if (n >= j.w.rows) continue;
      float v = acc[i][q];
      if constexpr (DUAL) v = siluf_(acc[i][q]) * acc2[i][q];
      o[n] = j.accumulate ? o[n] + v : v;
    }
  }
}

}  // namespace

void launch_tiled(const TileJob& j, int groups, int max_rows, cudaStream_t stream) {
  if (max_rows <= 0 || groups <= 0 || j.w.rows <= 0) return;
  const dim3 grid(grid_for(j.w.rows, kTileCols), grid_for(max_rows, kTileRows),
                  static_cast<unsigned>(groups));
  if (j.dual) {
    tiled_kernel<true><<<grid, kTThreads, 0, stream>>>(j);
  } else {
    tiled_kernel<false><<<grid, kTThreads, 0, stream>>>(j);
  }
}

}  // namespace pd::cuda
