// Matrix-vector products of bf16 weights for decode and verify steps (1..kMaxRows rows), streamed through
// shared memory by the bulk copy engine.
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
// Affine 8-bit matrices (MLX, groups of 32-128 columns) take the same stream, their codes, scales and biases
// copied per row; per group the product is y = s * sum((q - 128) x) + (b + 128 s) * sum(x). The centred
// codes are exact in bf16, so they enter the mma as the A operand (the activations hi + lo as for bf16), and
// the two terms do not cancel the way s * sum(q x) and b * sum(x) would. Each group's sum(x) is taken once
// per kernel, in f32. Lane (g, q) holds, for mma step j of its warp's slice, columns 16 j + 4 q .. + 3 of
// weight rows g and g + 8 (a 32-bit word of codes each) and of activation row g, so a step stays inside a
// group.
//
// Row-exact: an output depends only on its weight row and its activation row (mma_bf16); the order of its
// sum (chunks, the warp's columns, then the warps in order) is fixed by the matrix width. Unused rows are
// zero columns of B; rows past a matrix's end repeat its last row and are not stored.
#include <cstdlib>

#include "puredrive/backend/cuda/gemv_mma.h"
#include "puredrive/backend/cuda/stream_ring.cuh"

namespace pd::cuda {
namespace {

using namespace stream;

// The matrix of tile `tile` (i, advanced from its previous value) and the tile's first row.
__device__ __forceinline__ int64_t tile_rows(const MmaTargets& t, int64_t tile, int* i) {
  while (tile >= t.tile_end[*i]) ++*i;
  return (tile - (*i == 0 ? 0 : t.tile_end[*i - 1])) * kTile;
}

template <int KB, bool VEC>
__global__ void __launch_bounds__(kThreads, 1)
    gemv_stream_kernel(const __grid_constant__ MmaTargets t, const float* x, int64_t xs, int rows) {
  using S = Shape<KB>;
  extern __shared__ __align__(128) uint8_t smem[];
  const Ring<S> ring(smem);
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
  const int g = lane >> 2, q = lane & 3;
  const bool has_row = g < rows;
  const float* xr = x + (has_row ? g : 0) * xs;
  uint32_t frag[S::kChunks][S::kBlocks32][8];
  load_fragments<S, VEC>(xr, has_row, warp, q, frag);
  const int col = column_bytes<S>(warp, q);
  int f = 0;
  int buf = 0, i = 0;
  for (int64_t tile = tile_begin; tile < tile_stop; ++tile) {
    float acc[4] = {};
    consume_tile(ring, &f, col, g, lane, frag, acc);
    publish(ring.part, buf, warp, lane, acc);
    const int64_t n0 = tile_rows(t, tile, &i);
    if (threadIdx.x < kTile * 8) {
      const int off = static_cast<int>(threadIdx.x >> 3), r = static_cast<int>(threadIdx.x & 7);
      const float sum = tile_output(ring.part, buf, off, r);
      const DevMatrix& m = t.m[i];
      if (r < rows && n0 + off < m.rows) {
        float* o = t.out[i] + r * t.os[i] + n0 + off;
        *o = t.accumulate != 0 ? *o + sum : sum;
      }
    }
    buf ^= 1;
  }
}

// ---- Affine 8-bit ----

// A stage is one tile of whole rows: 16 rows of codes (rows 16 bytes apart modulo 128, so that the warp's
// 32-bit code loads, rows g and columns 4 q, hit 32 banks), then the 16 rows' scales and their biases as
// two blocks, each one bulk copy (the checkpoint stores a tile's scales contiguously). Three copies of a few
// hundred bytes per row instead of one of kilobytes ran the 8-bit decode slower than the CUDA-core kernels.
template <int KB>
struct AffineShape {
  static constexpr int kCols = 512 * KB;
  static constexpr int kSlice = kCols / kConsumers;  // columns per consumer warp: 32 - 256
  static constexpr int kSteps = kSlice / 16;         // mma steps per warp and tile
  static constexpr int kRowBytes = kCols + 16;
  static constexpr int kMetaBytes = kTile * (kCols / 32) * 2;  // room for 2-byte scales of groups >= 32
  static constexpr int kStageBytes = kTile * kRowBytes + 2 * kMetaBytes;
  static constexpr int kStages = 200 * 1024 / kStageBytes < 12 ? 200 * 1024 / kStageBytes : 12;
  static constexpr int kSmemBytes = kStages * kStageBytes + 2 * kConsumers * 32 * 16 + 2 * kStages * 8;
};

// Bytes of one row's scales (or biases).
__host__ __device__ inline int meta_row_bytes(const DevMatrix& m) {
  return static_cast<int>(m.cols / m.group_size) * (m.scale_dtype == SDType::kF32 ? 4 : 2);
}

__device__ __forceinline__ float meta_at(const uint8_t* p, int i, SDType t) {
  if (t == SDType::kF32) return reinterpret_cast<const float*>(p)[i];
  const uint16_t h = reinterpret_cast<const uint16_t*>(p)[i];
  return t == SDType::kBF16 ? bf16_bits(h) : f16_bits(h);
}

// Codes (bytes) I and I + 1 of w as a bf16 pair of q - 128, exactly: each byte becomes the low mantissa
// byte of the f32 2^23 + q, minus 2^23 + 128; a small integer's f32 has a zero low half, so its top half is
// its bf16.
template <int I>
__device__ __forceinline__ uint32_t centred_pair(uint32_t w) {
  constexpr uint32_t kMagic = 0x4B000000u;
  const float a = __uint_as_float(__byte_perm(w, kMagic, 0x7440 + I)) - 8388736.0f;
  const float b = __uint_as_float(__byte_perm(w, kMagic, 0x7441 + I)) - 8388736.0f;
  return __byte_perm(__float_as_uint(a), __float_as_uint(b), 0x7632);
}

// Lane (g, q)'s B fragments (hi pair, lo pair per mma step: columns 4 q, 4 q + 1 and 4 q + 2, 4 q + 3 of
// each 16 of the warp's slice, which starts at c0) and the sum of its columns of row g per step.
template <typename S, bool VEC>
__device__ __forceinline__ void load_affine_x(const float* xr, bool has_row, int c0, int q,
                                              uint32_t (&fr)[S::kSteps][4], float (&part)[S::kSteps]) {
#pragma unroll
  for (int j = 0; j < S::kSteps; ++j) {
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (has_row) {
      const float* p = xr + c0 + 16 * j + 4 * q;
      if constexpr (VEC) {
        const float4 a = *reinterpret_cast<const float4*>(p);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
      } else {
        v[0] = p[0], v[1] = p[1], v[2] = p[2], v[3] = p[3];
      }
    }
    split_pair(v[0], v[1], &fr[j][0], &fr[j][2]);
    split_pair(v[2], v[3], &fr[j][1], &fr[j][3]);
    part[j] = (v[0] + v[1]) + (v[2] + v[3]);
  }
}

// PPS: group pieces per warp slice (slice / min(group size, slice)).
template <int KB, int PPS, bool VEC>
__global__ void __launch_bounds__(kThreads, 1)
    gemv_stream_affine_kernel(const __grid_constant__ MmaTargets t, const float* x, int64_t xs, int rows) {
  using S = AffineShape<KB>;
  extern __shared__ __align__(128) uint8_t smem[];
  const Ring<S> ring(smem);
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int64_t tiles = t.tile_end[t.count - 1];
  const int64_t tile_begin = blockIdx.x * tiles / gridDim.x, tile_stop = (blockIdx.x + 1) * tiles / gridDim.x;
  // Every matrix of a launch has the group size and scale dtype of the first (gemv_stream_compatible).
  const DevMatrix& m0 = t.m[0];
  const int mrb = meta_row_bytes(m0);
  constexpr int kScales = kTile * S::kRowBytes, kBiases = kScales + S::kMetaBytes;
  if (threadIdx.x == 0) ring.init();
  __syncthreads();
  pdl_launch_dependents();

  if (warp == kConsumers) {
    int i = 0;
    for (int f = 0; f < static_cast<int>(tile_stop - tile_begin); ++f) {
      const int64_t n0 = tile_rows(t, tile_begin + f, &i);
      const DevMatrix& m = t.m[i];
      const int64_t valid = m.rows - n0 < kTile ? m.rows - n0 : kTile;  // rows past the end repeat the last
      const uint32_t meta = static_cast<uint32_t>(valid * mrb);
      ring.begin_fill(f, lane, kTile * S::kCols + 2 * meta);
      if (lane < kTile) {
        const int64_t n = lane < valid ? n0 + lane : m.rows - 1;
        ring.copy(f, lane * S::kRowBytes, static_cast<const uint8_t*>(m.data) + n * S::kCols, S::kCols);
      } else if (lane == kTile) {
        ring.copy(f, kScales, static_cast<const uint8_t*>(m.scales) + n0 * mrb, meta);
      } else if (lane == kTile + 1) {
        ring.copy(f, kBiases, static_cast<const uint8_t*>(m.biases) + n0 * mrb, meta);
      }
    }
    return;
  }

  pdl_wait();
  const int g = lane >> 2, q = lane & 3;
  const bool has_row = g < rows;
  const float* xr = x + (has_row ? g : 0) * xs;
  // A group piece: the columns of the warp's slice in one group.
  constexpr int kPieceSteps = S::kSteps / PPS;
  uint32_t frag[S::kSteps][4];
  float xsum[PPS][2];  // rows 2 q and 2 q + 1
  {
    float part[S::kSteps];
    load_affine_x<S, VEC>(xr, has_row, warp * S::kSlice, q, frag, part);
#pragma unroll
    for (int p = 0; p < PPS; ++p) {
      float sum = part[p * kPieceSteps];
#pragma unroll
      for (int j = 1; j < kPieceSteps; ++j) sum += part[p * kPieceSteps + j];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);  // the row's four lanes: the same bits in each
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      xsum[p][0] = __shfl_sync(0xffffffffu, sum, 8 * q);
      xsum[p][1] = __shfl_sync(0xffffffffu, sum, 8 * q + 4);
    }
  }
  const int col = warp * S::kSlice + 4 * q;  // byte offset of the lane's codes in a staged row
  const SDType sd = m0.scale_dtype;
  int buf = 0, i = 0;
  for (int f = 0; f < static_cast<int>(tile_stop - tile_begin); ++f) {
    float acc[4] = {};
    ring.wait_full(f);
    const uint8_t* st = ring.stage(f);
    const uint8_t* rg = st + g * S::kRowBytes;
    const uint8_t* r8 = st + (g + 8) * S::kRowBytes;
    float ga[4] = {};
#pragma unroll
    for (int j = 0; j < S::kSteps; ++j) {
      const uint32_t wg = *reinterpret_cast<const uint32_t*>(rg + col + 16 * j);
      const uint32_t w8 = *reinterpret_cast<const uint32_t*>(r8 + col + 16 * j);
      const uint32_t a[4] = {centred_pair<0>(wg), centred_pair<0>(w8), centred_pair<2>(wg),
                             centred_pair<2>(w8)};
      mma_bf16(ga, a, frag[j][0], frag[j][1]);
      mma_bf16(ga, a, frag[j][2], frag[j][3]);
      if ((j + 1) % kPieceSteps == 0) {  // the piece's group: scale and bias of rows g and g + 8
        const int p = j / kPieceSteps;
        const int gi = (warp * S::kSlice + p * kPieceSteps * 16) / m0.group_size;
        const uint8_t* sc = st + kScales + gi * (sd == SDType::kF32 ? 4 : 2);
        const float sg = meta_at(sc + g * mrb, 0, sd), s8 = meta_at(sc + (g + 8) * mrb, 0, sd);
        const float bg = meta_at(sc + S::kMetaBytes + g * mrb, 0, sd) + 128.0f * sg;
        const float b8 = meta_at(sc + S::kMetaBytes + (g + 8) * mrb, 0, sd) + 128.0f * s8;
        acc[0] = acc[0] + (sg * ga[0] + bg * xsum[p][0]);
        acc[1] = acc[1] + (sg * ga[1] + bg * xsum[p][1]);
        acc[2] = acc[2] + (s8 * ga[2] + b8 * xsum[p][0]);
        acc[3] = acc[3] + (s8 * ga[3] + b8 * xsum[p][1]);
#pragma unroll
        for (int e = 0; e < 4; ++e) ga[e] = 0.0f;
      }
    }
    ring.release(f, lane);
    publish(ring.part, buf, warp, lane, acc);
    const int64_t n0 = tile_rows(t, tile_begin + f, &i);
    if (threadIdx.x < kTile * 8) {
      const int off = static_cast<int>(threadIdx.x >> 3), r = static_cast<int>(threadIdx.x & 7);
      const float sum = tile_output(ring.part, buf, off, r);
      const DevMatrix& m = t.m[i];
      if (r < rows && n0 + off < m.rows) {
        float* o = t.out[i] + r * t.os[i] + n0 + off;
        *o = t.accumulate != 0 ? *o + sum : sum;
      }
    }
    buf ^= 1;
  }
}

template <typename S, auto Kernel>
void launch_stream_kernel(const MmaTargets& t, const float* x, int64_t xs, int rows, cudaStream_t stream) {
  static const int sms = prepare_kernel<S>(Kernel);
  const int64_t tiles = t.tile_end[t.count - 1];
  const unsigned grid = static_cast<unsigned>(tiles < sms ? tiles : sms);
  launch_pdl(Kernel, dim3(grid), dim3(kThreads), S::kSmemBytes, stream, t, x, xs, rows);
}

// The affine kernel of `pps` group pieces per warp slice (PPS, 2 PPS, ... up to groups of 32 columns).
template <int KB, int PPS, bool VEC>
void launch_affine(int pps, const MmaTargets& t, const float* x, int64_t xs, int rows, cudaStream_t stream) {
  using S = AffineShape<KB>;
  if constexpr (PPS * 32 < S::kSlice) {
    if (pps != PPS) {
      launch_affine<KB, 2 * PPS, VEC>(pps, t, x, xs, rows, stream);
      return;
    }
  }
  launch_stream_kernel<S, gemv_stream_affine_kernel<KB, PPS, VEC>>(t, x, xs, rows, stream);
}

template <int KB, bool VEC>
void launch_shape(const MmaTargets& t, const float* x, int64_t xs, int rows, cudaStream_t stream) {
  if (t.m[0].fmt == WFmt::kAffine) {
    constexpr int kSlice = AffineShape<KB>::kSlice;
    const int gs = t.m[0].group_size;
    launch_affine<KB, 1, VEC>(kSlice / (gs < kSlice ? gs : kSlice), t, x, xs, rows, stream);
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

bool env_enabled(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || v[0] != '0';
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

bool gemv_stream_supported(const DevMatrix& m) {
  static const bool enabled = env_enabled("PD_GEMV_STREAM");
  static const bool affine = env_enabled("PD_AFFINE_STREAM");
  const int64_t k = m.cols;
  if (!enabled || !(k == 512 || k == 1024 || k == 2048 || k == 4096) || m.rows <= 0 || !aligned16(m.data)) {
    return false;
  }
  if (m.fmt == WFmt::kBF16) return true;
  if (m.fmt != WFmt::kAffine || !affine || m.bits != 8) return false;
  // The scales of a tile fit the stage's room; copies of them are 16-byte aligned.
  const int mrb = meta_row_bytes(m);
  return (m.group_size == 32 || m.group_size == 64 || m.group_size == 128) &&
         mrb * kTile <= AffineShape<1>::kMetaBytes * static_cast<int>(k / 512) && mrb % 16 == 0 &&
         aligned16(m.scales) && aligned16(m.biases);
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
