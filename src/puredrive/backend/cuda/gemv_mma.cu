// Matrix-vector products of bf16 weights on the tensor cores, for decode and verify steps of 1..kMaxRows
// rows.
//
// Why: the CUDA-core kernels (ops_dense.cu) read every activation row once per weight chunk, so a 3-row
// verify step costs about twice a one-row step although the weights, most of the bytes, are read once. Here
// the weights are the A operand of mma.sync m16n8k16 (16 weight rows x 16 columns) and the step's rows the B
// operand (16 columns x 8 rows, unused rows zero): one instruction serves all rows, and the activations are
// split into bf16 hi + lo (about 16 significant bits, the prefill kernels' precision) once per 16 weight
// rows.
//
// Loads: lane (g, t) = (lane / 4, lane % 4) reads 16 bytes (8 columns) of weight rows g and g + 8 per 32
// columns. The mma sums over its 16 columns in an order of its own, so any one-to-one map of the columns onto
// the fragment's k slots gives the same kind of sum; the map used puts lane t's 8 columns [8t, 8t + 8) of
// each 32 into the k slots {2t, 2t+1, 2t+8, 2t+9} of two k16 steps, for the weights and the activations
// alike.
//
// Row-exact: an output depends only on its weight row and its activation row (mma_bf16), the order of its
// sum is fixed by the column split (slices_for, from the matrix width only) and the fixed-order sum of the
// slices' partials. A row gives the same bits whatever R, and in gemv and gemv_multi launches alike.
#include "puredrive/backend/cuda/gemv_mma.h"

#include "puredrive/backend/cuda/common.cuh"

namespace pd::cuda {
namespace {

constexpr int kWarps = kBlock / 32;
constexpr int kStep = 64;   // columns per load step: two 16-byte loads per lane and weight row
constexpr int kUnroll = 2;  // load steps in flight per warp

// Warps that split a tile's columns: as many as a block has, at least 256 columns each.
int slices_for(int64_t cols) {
  for (int s = kWarps; s > 1; s /= 2) {
    if (cols % (kStep * s) == 0 && cols / s >= 256) return s;
  }
  return 1;
}

template <bool VEC>
__device__ __forceinline__ void load_x8_or_zero(const float* p, bool valid, float x[8]) {
  if (valid) {
    load_x8<VEC>(p, x);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) x[j] = 0.0f;
  }
}

// acc += W[rows g, g + 8][k .. k + 32) . x[..][k .. k + 32) for the 8 columns of lane t (two k16 steps).
__device__ __forceinline__ void mma_32(float acc[4], const uint4& wg, const uint4& w8, const float x[8]) {
  uint32_t hi0, lo0, hi1, lo1;
  const uint32_t a0[4] = {wg.x, w8.x, wg.y, w8.y};
  split_pair(x[0], x[1], &hi0, &lo0);
  split_pair(x[2], x[3], &hi1, &lo1);
  mma_bf16(acc, a0, hi0, hi1);
  mma_bf16(acc, a0, lo0, lo1);
  const uint32_t a1[4] = {wg.z, w8.z, wg.w, w8.w};
  split_pair(x[4], x[5], &hi0, &lo0);
  split_pair(x[6], x[7], &hi1, &lo1);
  mma_bf16(acc, a1, hi0, hi1);
  mma_bf16(acc, a1, lo0, lo1);
}

// acc += W[rows g, g + 8][k_begin, k_end) . x[k_begin, k_end); wa, wb: weight rows g and g + 8 offset by lane
// t's 8 columns (8 * (lane % 4)); xr: the activation row of column g (lane / 4), zeros unless has_row.
// kUnroll load steps in flight.
template <bool VEC>
__device__ __forceinline__ void tile_product(float acc[4], const uint16_t* wa, const uint16_t* wb,
                                             const float* xr, bool has_row, int64_t k_begin, int64_t k_end,
                                             int q) {
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kStep * kUnroll) {
    uint4 la[kUnroll][2], lb[kUnroll][2];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = k0 + u * kStep;
      if (k < k_end) {
        la[u][0] = __ldg(reinterpret_cast<const uint4*>(wa + k));
        la[u][1] = __ldg(reinterpret_cast<const uint4*>(wa + k + 32));
        lb[u][0] = __ldg(reinterpret_cast<const uint4*>(wb + k));
        lb[u][1] = __ldg(reinterpret_cast<const uint4*>(wb + k + 32));
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = k0 + u * kStep;
      if (k >= k_end) break;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float xv[8];
        load_x8_or_zero<VEC>(xr + k + 32 * h + 8 * q, has_row, xv);
        mma_32(acc, la[u][h], lb[u][h], xv);
      }
    }
  }
}

// Output element e (0..3) of lane (g, q)'s accumulator: step row r and weight row n0 + offset.
__device__ __forceinline__ int acc_row(int e, int q) {
  return 2 * q + (e & 1);
}
__device__ __forceinline__ int acc_offset(int e, int g) {
  return g + (e >= 2 ? 8 : 0);
}

template <bool VEC, int S>
__global__ void __launch_bounds__(kBlock, 3)
    gemv_mma_kernel(const __grid_constant__ MmaTargets t, const float* x, int64_t xs, int rows) {
  constexpr int kTilesPerBlock = kWarps / S;
  __shared__ float4 part[kWarps][32];
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int g = lane >> 2, q = lane & 3;
  const int slot = warp / S, slice = warp % S;
  const int64_t K = t.m[0].cols, width = K / S;
  const int64_t tiles = t.tile_end[t.count - 1];
  const bool has_row = g < rows;
  const float* xr = x + (has_row ? g : 0) * xs;
  pdl_launch_dependents();
  pdl_wait();
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kTilesPerBlock; base < tiles;
       base += static_cast<int64_t>(gridDim.x) * kTilesPerBlock) {
    const int64_t tile = base + slot;
    float acc[4] = {};
    int i = 0;
    if (tile < tiles) {
      while (tile >= t.tile_end[i]) ++i;
      const DevMatrix& m = t.m[i];
      const int64_t n0 = (tile - (i == 0 ? 0 : t.tile_end[i - 1])) * kTileN;
      // Rows past the matrix read its last row; their results are not stored.
      const int64_t ra = n0 + g < m.rows ? n0 + g : m.rows - 1,
                    rb = n0 + g + 8 < m.rows ? n0 + g + 8 : m.rows - 1;
      const uint16_t* w = static_cast<const uint16_t*>(m.data) + 8 * q;
      tile_product<VEC>(acc, w + ra * K, w + rb * K, xr, has_row, slice * width, (slice + 1) * width, q);
    }
    if constexpr (S > 1) {
      // The slices' partials summed in slice order by the tile's first warp.
      part[warp][lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
      __syncthreads();
      if (slice == 0) {
#pragma unroll
        for (int s = 1; s < S; ++s) {
          const float4 p = part[warp + s][lane];
          acc[0] += p.x, acc[1] += p.y, acc[2] += p.z, acc[3] += p.w;
        }
      }
      __syncthreads();
    }
    if (slice == 0 && tile < tiles) {
      const DevMatrix& m = t.m[i];
      const int64_t n0 = (tile - (i == 0 ? 0 : t.tile_end[i - 1])) * kTileN;
      float* out = t.out[i];
      const int64_t os = t.os[i];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = acc_row(e, q);
        const int64_t n = n0 + acc_offset(e, g);
        if (r < rows && n < m.rows) {
          float* o = out + r * os + n;
          *o = t.accumulate != 0 ? *o + acc[e] : acc[e];
        }
      }
    }
  }
}

template <bool VEC, int S>
void launch_slices(const MmaTargets& t, const float* x, int64_t xs, int rows, cudaStream_t stream) {
  static const unsigned resident = resident_blocks(gemv_mma_kernel<VEC, S>);
  constexpr int kTilesPerBlock = kWarps / S;
  const int64_t groups = (t.tile_end[t.count - 1] + kTilesPerBlock - 1) / kTilesPerBlock;
  const unsigned grid = groups < resident ? static_cast<unsigned>(groups) : resident;
  launch_pdl(gemv_mma_kernel<VEC, S>, dim3(grid), dim3(kBlock), 0, stream, t, x, xs, rows);
}

void launch_targets(const MmaTargets& t, const float* x, int64_t xs, int rows, cudaStream_t stream) {
  bool stream_all = true;
  for (int i = 0; i < t.count; ++i) {
    stream_all = stream_all && gemv_stream_supported(t.m[i]) && gemv_stream_compatible(t.m[0], t.m[i]);
  }
  if (stream_all) {
    launch_gemv_stream(t, x, xs, rows, stream);
    return;
  }
  const bool vec = reinterpret_cast<uintptr_t>(x) % 16 == 0 && xs % 4 == 0;
  const int s = slices_for(t.m[0].cols);
  auto go = [&](auto v) {
    constexpr bool V = decltype(v)::value;
    switch (s) {
      case 8:
        launch_slices<V, 8>(t, x, xs, rows, stream);
        return;
      case 4:
        launch_slices<V, 4>(t, x, xs, rows, stream);
        return;
      case 2:
        launch_slices<V, 2>(t, x, xs, rows, stream);
        return;
      default:
        launch_slices<V, 1>(t, x, xs, rows, stream);
        return;
    }
  };
  if (vec) {
    go(std::true_type{});
  } else {
    go(std::false_type{});
  }
}

int64_t tiles_of(const DevMatrix& m) {
  return (m.rows + kTileN - 1) / kTileN;
}

// False when PD_GEMV_MMA=0 (read once): the CUDA-core kernels, for same-run comparisons.
bool mma_products_enabled() {
  static const bool enabled = env_switch_on("PD_GEMV_MMA");
  return enabled;
}

}  // namespace

bool gemv_mma_supported(const DevMatrix& m) {
  if (m.fmt == WFmt::kAffine) return mma_products_enabled() && gemv_stream_supported(m);
  return mma_products_enabled() && m.fmt == WFmt::kBF16 && m.cols >= kStep && m.cols % kStep == 0 &&
         m.rows > 0;
}

bool gemv_multi_mma_supported(const GemvMulti& g) {
  for (int i = 0; i < g.count; ++i) {
    if (!gemv_mma_supported(g.m[i])) return false;
    // Affine matrices have no fallback in launch_targets: they stream together or not at all.
    if (g.m[0].fmt == WFmt::kAffine && !gemv_stream_compatible(g.m[0], g.m[i])) return false;
  }
  return true;
}

bool gemv_multi_streams(const GemvMulti& g) {
  if (!gemv_multi_mma_supported(g)) return false;
  for (int i = 0; i < g.count; ++i) {
    if (!gemv_stream_supported(g.m[i]) || !gemv_stream_compatible(g.m[0], g.m[i])) return false;
  }
  return true;
}

void launch_gemv_mma(const DevMatrix& w, const float* x, int64_t xs, float* out, int64_t os, int rows,
                     bool accumulate, cudaStream_t stream) {
  MmaTargets t;
  t.m[0] = w;
  t.out[0] = out;
  t.os[0] = os;
  t.tile_end[0] = tiles_of(w);
  t.count = 1;
  t.accumulate = accumulate ? 1 : 0;
  launch_targets(t, x, xs, rows, stream);
}

namespace {
MmaTargets targets_of(const GemvMulti& g) {
  MmaTargets t;
  int64_t tiles = 0;
  for (int i = 0; i < g.count; ++i) {
    t.m[i] = g.m[i];
    t.out[i] = g.out[i];
    t.os[i] = g.os[i];
    tiles += tiles_of(g.m[i]);
    t.tile_end[i] = tiles;
  }
  t.count = g.count;
  return t;
}
}  // namespace

void launch_gemv_multi_mma(const GemvMulti& g, const float* x, int64_t xs, int rows, cudaStream_t stream) {
  launch_targets(targets_of(g), x, xs, rows, stream);
}

void launch_gemv_multi_normed(const GemvMulti& g, const float* x, int64_t xs, int rows, const float* norm,
                              float eps, cudaStream_t stream) {
  MmaTargets t = targets_of(g);
  t.norm = norm;
  t.norm_eps = eps;
  launch_gemv_stream(t, x, xs, rows, stream);
}

}  // namespace pd::cuda
