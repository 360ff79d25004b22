// Matrix-vector products of bf16 and affine 8-bit weights for decode and verify steps (1..kMaxRows rows),
// streamed through shared memory by the bulk copy engine.
//
// Why: gemv_mma.cu keeps the weights in flight with register loads, a few per lane, and each warp waits for
// its loads before it issues the next ones. The decode step's matrices are small (17-50 MB): such a kernel
// spends much of its time ramping up and down, and the 16 MB products reached 1.3 TB/s. Here one producer
// warp per SM keeps kStages chunks of 16 weight rows (about 200 KB) in flight with cp.async.bulk, from the
// start of the kernel (weights do not depend on the previous kernel, so it need not wait for it), and 16
// consumer warps multiply what has arrived. Measured on the H200 (ncu, one-row bf16 steps of the 35B shape):
// the GDN input products 19.5 -> 17.1 us, the 17 MB output products 13.1 -> 8.8 us, the 1 GB output head
// 253 -> 239 us (4.26 TB/s).
//
// The product: the tensor-core scheme of gemv_mma.cu (weights as the A operand of mma m16n8k16, the step's
// rows as B, activations split into bf16 hi + lo). Consumer warp w owns columns [w * slice, (w + 1) * slice)
// of every chunk, and keeps the hi/lo fragments of its columns of all 8 rows in registers for the whole
// kernel. Per tile, each warp's 16 x 8 partial goes to shared memory and the 16 partials of an output are
// summed in warp order.
//
// Affine 4-, 6- and 8-bit matrices (MLX, groups of 32-128 columns) take the same stream, one stage per tile
// of whole rows, their codes multiplied by the integer tensor cores (stream_affine.cuh).
//
// Row-exact: an output depends only on its weight row and its activation row (mma_bf16; for affine weights
// also the activation row's fixed-point scale, which depends on that row alone); the order of its sum
// (chunks, the warp's columns, then the warps in order) is fixed by the matrix width. Unused rows are
// zero columns of B; rows past a matrix's end repeat its last row and are not stored.

#include "puredrive/backend/cuda/gemv_mma.h"
#include "puredrive/backend/cuda/stream_affine.cuh"
#include "puredrive/backend/cuda/trace.cuh"

namespace pd::cuda {
namespace {

using namespace stream;

// The matrix of tile `tile` (i, advanced from its previous value) and the tile's first row.
__device__ __forceinline__ int64_t tile_rows(const MmaTargets& t, int64_t tile, int* i) {
  while (tile >= t.tile_end[*i]) ++*i;
  return (tile - (*i == 0 ? 0 : t.tile_end[*i - 1])) * kTile;
}

// Threads [128 team, 128 team + 128) store the outputs of tile `tile` (published in partial slot `slot`) to
// its matrix; every consumer thread advances *i.
__device__ __forceinline__ void store_tile(const MmaTargets& t, const float4* part, int slot, int64_t tile,
                                           int* i, int rows, int team = 0) {
  const int64_t n0 = tile_rows(t, tile, i);
  const int id = static_cast<int>(threadIdx.x) - team * kTile * 8;
  if (id >= 0 && id < kTile * 8) {
    const int off = id >> 3, r = id & 7;
    const float sum = tile_output(part, slot, off, r);
    const DevMatrix& m = t.m[*i];
    if (r < rows && n0 + off < m.rows) {
      float* o = t.out[*i] + r * t.os[*i] + n0 + off;
      *o = t.accumulate != 0 ? *o + sum : sum;
    }
  }
}

// With a fused input norm (t.norm), the inverse rms of row g (every consumer warp calls it); 1 without.
__device__ __forceinline__ float row_norm(const MmaTargets& t, const float* x, int64_t xs, int rows, int n,
                                          int warp, int lane, int g) {
  if (t.norm == nullptr) return 1.0f;
  __shared__ float inv[kMaxRows];
  norm_inverses(x, xs, rows, n, t.norm_eps, warp, lane, inv);
  return g < rows ? inv[g] : 1.0f;
}

template <int KB, bool VEC>
__global__ void __launch_bounds__(kThreads, 1)
    gemv_stream_kernel(const __grid_constant__ MmaTargets t, const float* x, int64_t xs, int rows) {
  using S = Shape<KB>;
  PD_TRACE_SCOPE(kGemvStream, rows);
  extern __shared__ __align__(128) uint8_t smem[];
  const Ring<S> ring(smem, t.evict_first != 0);
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int64_t tiles = t.tile_end[t.count - 1];
  const int64_t tile_begin = blockIdx.x * tiles / gridDim.x, tile_stop = (blockIdx.x + 1) * tiles / gridDim.x;
  if (threadIdx.x == 0) ring.init();
  __syncthreads();
  pdl_launch_dependents();

  if (warp == kConsumers) {
    // Producer: the weights are constant, so it streams them without waiting for the previous kernel.
    const int fills = static_cast<int>(tile_stop - tile_begin) * S::kChunks;
    int i = 0;
    for (int f = 0; f < fills; ++f) {
      const int64_t n0 = tile_rows(t, tile_begin + f / S::kChunks, &i);
      const DevMatrix& m = t.m[i];
      ring.begin_fill(f, lane);
      if (lane < kTile) {
        const int64_t n = n0 + lane < m.rows ? n0 + lane : m.rows - 1;
        ring.copy_row(f, lane,
                      static_cast<const uint16_t*>(m.data) + n * S::kCols + (f % S::kChunks) * S::kChunk);
      }
    }
    return;
  }

  // Consumers: the activations' fragments of this warp's columns, lane (g, q) holding row g.
  pdl_wait();
  PD_TRACE_STAMP(0);
  const int g = lane >> 2, q = lane & 3;
  const bool has_row = g < rows;
  const float* xr = x + (has_row ? g : 0) * xs;
  // The activations load while the norm's sums do (one round trip instead of two).
  float v[S::kChunks][S::kBlocks32][8];
  load_activations<S, VEC>(xr, has_row, warp, q, v);
  const float inv = row_norm(t, x, xs, rows, S::kCols, warp, lane, g);
  uint32_t frag[S::kChunks][S::kBlocks32][8];
  make_fragments<S>(v, has_row, warp, q, frag, t.norm, inv);
  PD_TRACE_STAMP(1);
  const int col = column_bytes<S>(warp, q);
  int f = 0;
  int buf = 0, i = 0;
  for (int64_t tile = tile_begin; tile < tile_stop; ++tile) {
    float acc[4] = {};
    consume_tile(ring, &f, col, g, lane, frag, acc);
    publish(ring.part, buf, warp, lane, acc);
    store_tile(t, ring.part, buf, tile, &i, rows);
    buf ^= 1;
    if (tile == tile_begin) PD_TRACE_STAMP(2);
  }
}

// Affine matrices (stream_affine.cuh): the same tiles, one stage per tile.
template <int KB, int BITS, int PPS, bool VEC>
__global__ void __launch_bounds__(kThreads, 1)
    gemv_stream_affine_kernel(const __grid_constant__ MmaTargets t, const float* x, int64_t xs, int rows) {
  using S = AffineShape<KB, BITS>;
  PD_TRACE_SCOPE(kGemvStreamAffine, rows);
  extern __shared__ __align__(128) uint8_t smem[];
  const Ring<S> ring(smem, t.evict_first != 0);
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int64_t tiles = t.tile_end[t.count - 1];
  const int64_t tile_begin = blockIdx.x * tiles / gridDim.x, tile_stop = (blockIdx.x + 1) * tiles / gridDim.x;
  const int count = static_cast<int>(tile_stop - tile_begin);
  // Every matrix of a launch has the group size and scale dtype of the first (gemv_stream_compatible).
  const AffineMeta meta(t.m[0]);
  if (threadIdx.x == 0) ring.init();
  __syncthreads();
  pdl_launch_dependents();

  if (warp == kConsumers) {
    int i = 0;
    for (int f = 0; f < count; ++f) {
      const int64_t n0 = tile_rows(t, tile_begin + f, &i);
      const DevMatrix& m = t.m[i];
      const int valid = static_cast<int>(m.rows - n0 < kTile ? m.rows - n0 : kTile);  // rows past the end
      ring.begin_fill(f, lane, kTile * S::kCodeBytes + 2 * valid * meta.row_bytes);   // repeat the last
      if (lane < kTile) {
        const int64_t n = lane < valid ? n0 + lane : m.rows - 1;
        ring.copy(f, lane * S::kRowBytes, static_cast<const uint8_t*>(m.data) + n * S::kCodeBytes,
                  S::kCodeBytes);
      }
      copy_meta<S>(ring, f, lane, kTile, m.scales, m.biases, meta.row_bytes, n0, 0, valid);
    }
    return;
  }

  pdl_wait();
  const int g = lane >> 2, q = lane & 3;
  AffineX<S, PPS> ax;
  {
    float v[S::kBlocks][8];
    AffineX<S, PPS>::template load_raw<VEC>(g < rows ? x + g * xs + warp * S::kSlice : nullptr, q, v);
    const float inv = row_norm(t, x, xs, rows, S::kCols, warp, lane, g);
    if (t.norm != nullptr && g < rows) {
#pragma unroll
      for (int j = 0; j < S::kBlocks; ++j) normalize8(v[j], t.norm + warp * S::kSlice + 32 * j + 8 * q, inv);
    }
    ax.make(v, q);
  }
  // t.tiles_per_sync tiles per exchange of the partials, tile k stored by thread team k.
  const int per = t.tiles_per_sync;
  int buf = 0, i = 0;
  for (int f0 = 0; f0 < count; f0 += per, buf ^= 1) {
#pragma unroll
    for (int k = 0; k < kTilesPerSync; ++k) {
      if (k < per && f0 + k < count) {
        float acc[4] = {};
        ring.wait_full(f0 + k);
        affine_product<S, PPS>(ring.stage(f0 + k), warp, lane, meta, ax, acc);
        ring.release(f0 + k, lane);
        stash(ring.part, buf * kTilesPerSync + k, warp, lane, acc);
      }
    }
    consumers_sync();
    for (int k = 0; k < per && f0 + k < count; ++k) {
      store_tile(t, ring.part, buf * kTilesPerSync + k, tile_begin + f0 + k, &i, rows, k);
    }
  }
}

template <typename S, auto Kernel>
void launch_stream_kernel(const MmaTargets& t, const float* x, int64_t xs, int rows, cudaStream_t stream) {
  static const int sms = prepare_kernel<S>(Kernel);
  static const bool evict_first = env_switch_on("PD_L2_EVICT_FIRST");
  PD_TRACE_ENSURE();
  const int64_t tiles = t.tile_end[t.count - 1];
  const unsigned grid = static_cast<unsigned>(tiles < sms ? tiles : sms);
  MmaTargets te = t;
  te.evict_first = evict_first ? 1 : 0;
  launch_pdl(Kernel, dim3(grid), dim3(kThreads), S::kSmemBytes, stream, te, x, xs, rows);
}

template <int KB, bool VEC>
void launch_shape(const MmaTargets& t, const float* x, int64_t xs, int rows, cudaStream_t stream) {
  if (t.m[0].fmt == WFmt::kAffine) {
    static const int per = env_switch_on("PD_STREAM_PAIRS") ? kTilesPerSync : 1;
    MmaTargets tp = t;
    tp.tiles_per_sync = per;
    with_stream_bits(t.m[0].bits, [&](auto bits) {
      constexpr int kBits = decltype(bits)::value;
      using S = AffineShape<KB, kBits>;
      with_pieces<S>(t.m[0].group_size, [&](auto pps) {
        launch_stream_kernel<S, gemv_stream_affine_kernel<KB, kBits, decltype(pps)::value, VEC>>(
            tp, x, xs, rows, stream);
      });
    });
    return;
  }
  launch_stream_kernel<Shape<KB>, gemv_stream_kernel<KB, VEC>>(t, x, xs, rows, stream);
}

template <bool VEC>
void launch_vec(const MmaTargets& t, const float* x, int64_t xs, int rows, cudaStream_t stream) {
  switch (t.m[0].cols) {
    case 512:
      launch_shape<1, VEC>(t, x, xs, rows, stream);
      return;
    case 1024:
      launch_shape<2, VEC>(t, x, xs, rows, stream);
      return;
    case 2048:
      launch_shape<4, VEC>(t, x, xs, rows, stream);
      return;
    default:
      launch_shape<8, VEC>(t, x, xs, rows, stream);
      return;
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

bool gemv_stream_supported(const DevMatrix& m) {
  static const bool enabled = env_switch_on("PD_GEMV_STREAM");
  static const bool affine = env_switch_on("PD_AFFINE_STREAM");
  const int64_t k = m.cols;
  if (!enabled || !(k == 512 || k == 1024 || k == 2048 || k == 4096) || m.rows <= 0 || !aligned16(m.data)) {
    return false;
  }
  if (m.fmt == WFmt::kBF16) return true;
  return affine && affine_stream_layout(m);
}

bool gemv_stream_compatible(const DevMatrix& a, const DevMatrix& b) {
  return a.fmt == b.fmt && a.cols == b.cols &&
         (a.fmt != WFmt::kAffine ||
          (a.bits == b.bits && a.group_size == b.group_size && a.scale_dtype == b.scale_dtype));
}

void launch_gemv_stream(const MmaTargets& t, const float* x, int64_t xs, int rows, cudaStream_t stream) {
  if (reinterpret_cast<uintptr_t>(x) % 16 == 0 && xs % 4 == 0) {
    launch_vec<true>(t, x, xs, rows, stream);
  } else {
    launch_vec<false>(t, x, xs, rows, stream);
  }
}

}  // namespace pd::cuda
