// Tensor-core matrix products for prefill steps (kernels.h, "Tensor-core products for prefill"). A block
// computes kMmaRows activation rows x kMmaCols (bf16 weights: kMmaColsWide) weight rows with mma.sync
// m16n8k16 (bf16 in, f32 accumulate); 8 warps in a 2 x 4 layout, 32 x 32 (32 x 64) outputs each. Columns
// advance in stages of kBK through a kStages-deep pipeline: activations (f32) and bf16 weights are copied
// into shared memory with cp.async; weights of other formats are loaded into registers one stage ahead and
// decoded (common.cuh, the same f32 values every other kernel uses) into bf16 hi/lo tiles when the stage
// before has been consumed. Affine weights are not decoded: their codes and each row's group scale and bias
// are copied with cp.async kAffineStages deep, and one stage ahead of the product each thread turns a chunk
// of codes into q - 2^(b-1), exact in bf16, in a double-buffered tile; each group's sum is scaled once
// (below). Each thread splits the activations it copied into bf16 hi + lo tiles (double-buffered) once its
// copies have landed, so no other barrier is needed and every warp takes both operands with ldmatrix: a stage
// costs the block one split per activation instead of one per warp column.
//
// Determinism: an output element is the sum, in ascending k16 steps, of hi*hi, lo*hi and (weights neither
// bf16 nor affine) hi*lo products of its own activation row and weight row, accumulated in one register.
// Affine weights (w = s q + b, groups of 32-128 columns): per group, g = the sum of (q - o) x_hi and (q - o)
// x_lo in ascending k16 steps, then y += s g and y += (b + o s) sum(x), with sum(x) the f32 sum of the
// group's activations in a fixed order. Nothing depends on R, on the tile a row lands in, or on the block's
// other rows (zero rows and zero columns pad the tiles).

#include "puredrive/backend/cuda/common.cuh"
#include "puredrive/backend/cuda/gemm_mma_tiles.cuh"
#include "puredrive/backend/cuda/moe_partition.h"

namespace pd::cuda {
namespace {

using namespace gemm_tiles;

// WIDE (bf16 weights only, mma_tile_cols): 256 weight rows per tile, a warp 32 x 64 outputs, so each
// activation fragment serves twice the products (fewer shared-memory reads per mma). Each output keeps
// its sum and its order, so its bits are those of the 128-row tiles.
template <int FMT, int BITS, bool DUAL, bool WIDE>
__global__ void __launch_bounds__(kThreads, 2) mma_kernel(const __grid_constant__ MmaJob j) {
  constexpr bool kDirect = FMT == static_cast<int>(WFmt::kBF16);      // weights copied as they are
  constexpr bool kFactored = FMT == static_cast<int>(WFmt::kAffine);  // codes copied, groups scaled once
  constexpr bool kSplit = !kDirect && !kFactored;                     // weights decoded into hi + lo tiles
  constexpr int kXSlots = kFactored ? kAffineStages : kStages;        // activation stages in flight
  static_assert(!WIDE || kDirect, "wide tiles hold bf16 weights only");
  constexpr int kBN = WIDE ? kMmaColsWide : kMmaCols;
  constexpr int kWStage = w_stage(WIDE);
  constexpr int kWN = kBN / 4;  // a warp's weight rows
  constexpr int kNI = kWN / 8;  // its n8 tiles
  constexpr int kChunks = kBN * kBK / 8 / kThreads;
  extern __shared__ __align__(16) uint8_t smem[];
  // Affine: the stages' codes and scale words after the activations, then two bf16 code tiles.
  float* const xs = reinterpret_cast<float*>(smem);
  uint8_t* const codes = smem + static_cast<size_t>(kXSlots) * kXStage * 4;
  uint32_t* const scale_words =
      reinterpret_cast<uint32_t*>(codes + (kFactored ? kAffineStages * code_stage(BITS) : 0));
  uint16_t* const wh = reinterpret_cast<uint16_t*>(reinterpret_cast<uint8_t*>(scale_words) +
                                                   (kFactored ? kAffineStages * kScaleStage * 4 : 0));
  uint16_t* const wl = wh + (kFactored ? 2 : kStages) * kWStage;
  uint16_t* const ah_s = wl + (kSplit ? kStages * kWStage : 0);  // [2][kAStage] hi, then [2][kAStage] lo
  uint16_t* const al_s = ah_s + 2 * kAStage;
  __shared__ int s_src[kBM], s_dst[kBM];
  // Affine: the two code tiles' group scale s and offset bias b + o s per tile row, and the two split
  // buffers' activation sums per row.
  __shared__ __align__(8) float s_scale[kFactored ? 2 : 1][kFactored ? kBN : 2];
  __shared__ __align__(8) float s_offset[kFactored ? 2 : 1][kFactored ? kBN : 2];
  __shared__ float s_xsum[kFactored ? 2 : 1][kBM];

  int p = 0;
  while (p + 1 < j.parts && static_cast<int>(blockIdx.y) >= j.part[p].n_tiles_end) ++p;
  const MmaPart& P = j.part[p];
  const int nt = static_cast<int>(blockIdx.y) - (p == 0 ? 0 : j.part[p - 1].n_tiles_end);
  // The next kernel is let in only once this block's main loop is done (below): a grid of several waves
  // would otherwise share its SMs with blocks that only wait.
  pdl_wait();

  int expert = 0, first = 0, count = 0;
  if (P.grouped) {
    const int t = static_cast<int>(blockIdx.x);
    if (t >= j.tile_start[j.experts]) return;  // uniform over the block
    expert = expert_of_tile(j.tile_start, j.experts, t);
    first = (t - j.tile_start[expert]) * kBM;
    count = min(kBM, j.count[expert] - first);
  } else {
    first = static_cast<int>(blockIdx.x) * kBM;
    if (first >= P.rows) return;
    count = min(kBM, P.rows - first);
  }
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < kBM) {
    int s = -1, d = -1;
    if (tid < count) {
      if (P.grouped) {
        const int v = j.list[static_cast<int64_t>(expert) * j.list_stride + first + tid];
        s = v / P.list_div;
        d = v;
      } else {
        s = first + tid;
        d = s;
      }
    }
    s_src[tid] = s;
    s_dst[tid] = d;
  }
  __syncthreads();

  const int64_t K = P.w.cols;
  const int kt_count = static_cast<int>((K + kBK - 1) / kBK);
  const bool xvec = (reinterpret_cast<uintptr_t>(P.x) % 16 == 0) && (P.xs % 4 == 0);
  const float* xrow[kXChunks];
#pragma unroll
  for (int i = 0; i < kXChunks; ++i) {
    const int s = s_src[(tid + i * kThreads) >> 3];
    xrow[i] = s >= 0 ? P.x + static_cast<int64_t>(s) * P.xs : nullptr;
  }
  // Tile row r holds weight row nt * kBN + r, or for a gate/up pair row nt * kBN / 2 + r / 2 of the gate
  // (r even) or the up projection (r odd): a thread's accumulator pair (c0, c1) is then (gate, up) of one
  // output.
  // bf16 weights: chunk i is chunk 0's row + i kRowStep of the same matrix (kThreads / 4 tile rows on, an
  // even count), so one source serves them all and keeps the wide tile's registers down.
  constexpr int kSources = kDirect ? 1 : kChunks;
  constexpr int kRowStep = kThreads / 4 / (DUAL ? 2 : 1);
  WSource src[kSources];
#pragma unroll
  for (int i = 0; i < kSources; ++i) {
    const int r = (tid + i * kThreads) >> 2;
    if constexpr (DUAL) {
      src[i] =
          weight_source((r & 1) != 0 ? P.w2 : P.w, expert, static_cast<int64_t>(nt) * (kBN / 2) + (r >> 1));
    } else {
      src[i] = weight_source(P.w, expert, static_cast<int64_t>(nt) * kBN + r);
    }
  }

  auto load_x = [&](int stage, int64_t k0) {
    float* base = xs + stage * kXStage;
#pragma unroll
    for (int i = 0; i < kXChunks; ++i) {
      const int c = tid + i * kThreads;
      const int64_t k = k0 + (c & 7) * 4;
      const bool ok = xrow[i] != nullptr && k < K;
      float* dst = base + (c >> 3) * kXPitch + (c & 7) * 4;
      const float* s = ok ? xrow[i] + k : P.x;
      if (xvec) {
        copy_or_zero_async<16>(dst, s, ok);
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q) copy_or_zero_async<4>(dst + q, ok ? s + q : P.x, ok);
      }
    }
  };
  // The thread's own copies of the stage, split into buffer `buf` (they landed: copy_async_wait by this
  // thread).
  auto split_x = [&](int stage, int buf) {
    const float* base = xs + stage * kXStage;
#pragma unroll
    for (int i = 0; i < kXChunks; ++i) {
      const int c = tid + i * kThreads;
      const float4 v = *reinterpret_cast<const float4*>(base + (c >> 3) * kXPitch + (c & 7) * 4);
      uint2 hi, lo;
      split_pair(v.x, v.y, &hi.x, &lo.x);
      split_pair(v.z, v.w, &hi.y, &lo.y);
      const int at = buf * kAStage + (c >> 3) * kAPitch + (c & 7) * 4;
      *reinterpret_cast<uint2*>(ah_s + at) = hi;
      *reinterpret_cast<uint2*>(al_s + at) = lo;
      if constexpr (kFactored) {
        // The row's 32 activations of the stage are 8 neighbouring lanes' four: added in a fixed tree.
        float sum = (v.x + v.y) + (v.z + v.w);
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        sum += __shfl_xor_sync(0xffffffffu, sum, 4);
        if ((c & 7) == 0) s_xsum[buf][c >> 3] = sum;
      }
    }
  };
  // Affine: each thread's copy sources, found once. Its code copies (kUnit bytes of a row's stage each, a
  // null source past the matrix: zeros), its scale or bias word (of tile row tid / 2: the scale for even tid;
  // 0 past the matrix), and for tile row tid (< kBN) how to read the row's two words: the scale dtype and
  // whether each 16-bit value starts 2 bytes into its word (bit 0: scale, bit 1: bias; for group 0).
  constexpr int kUnit = kFactored ? code_copy_bytes(BITS) : 4;
  constexpr int kCopies = kFactored ? kBN * kBK * BITS / 8 / kUnit : 1;
  constexpr int kCopiesPerThread = (kCopies + kThreads - 1) / kThreads;
  const uint8_t* code_src[kCopiesPerThread] = {};
  uintptr_t scale_src = 0;
  int scale_shift = 0, scale_size_log = 1;
  SDType row_dtype = SDType::kF32;
  int row_shift = 0, row_halves = 0;
  if constexpr (kFactored) {
    // Tile row r is weight row `affine_row(r)` of `affine_matrix(r)`.
    auto affine_matrix = [&](int r) -> const DevMatrix& { return DUAL && (r & 1) != 0 ? P.w2 : P.w; };
    auto affine_row = [&](int r) -> int64_t {
      return DUAL ? static_cast<int64_t>(nt) * (kBN / 2) + (r >> 1) : static_cast<int64_t>(nt) * kBN + r;
    };
    // Group 0 of row n's scales (or biases).
    auto scales_of_row = [&](const DevMatrix& m, const void* scales, int64_t n) {
      const int64_t groups = m.cols / m.group_size, size = m.scale_dtype == SDType::kF32 ? 4 : 2;
      return reinterpret_cast<uintptr_t>(scales) + expert * m.scale_stride + n * groups * size;
    };
#pragma unroll
    for (int i = 0; i < kCopiesPerThread; ++i) {
      const int w = tid + i * kThreads;
      constexpr int kUnitsPerRow = kBK * BITS / 8 / kUnit;
      const int r = w / kUnitsPerRow;
      const DevMatrix& m = affine_matrix(r);
      const int64_t n = affine_row(r);
      if (w < kCopies && n < m.rows) {
        code_src[i] = static_cast<const uint8_t*>(m.data) + expert * m.data_stride + n * (m.cols * BITS / 8) +
                      (w % kUnitsPerRow) * kUnit;
      }
    }
    static_assert(kScaleStage == kThreads, "one scale or bias word per thread");
    {
      const DevMatrix& m = affine_matrix(tid >> 1);
      const int64_t n = affine_row(tid >> 1);
      if (n < m.rows) scale_src = scales_of_row(m, (tid & 1) != 0 ? m.biases : m.scales, n);
      scale_shift = __ffs(m.group_size) - 1;
      scale_size_log = m.scale_dtype == SDType::kF32 ? 2 : 1;
    }
    if (tid < kBN) {
      const DevMatrix& m = affine_matrix(tid);
      const int64_t n = affine_row(tid);
      row_dtype = m.scale_dtype;
      row_shift = __ffs(m.group_size) - 1;
      row_halves = static_cast<int>((scales_of_row(m, m.scales, n) >> 1) & 1) |
                   static_cast<int>(((scales_of_row(m, m.biases, n) >> 1) & 1) << 1);
    }
  }
  (void)code_src;
  (void)scale_src;
  (void)scale_shift;
  (void)scale_size_log;
  (void)row_dtype;
  (void)row_shift;
  (void)row_halves;
  // Affine: copies stage `slot`'s codes (kBK * BITS / 8 bytes per tile row) and each row's scale and bias
  // words; rows past the matrix read as zeros (codes, scale and bias: their outputs are dropped).
  auto load_codes = [&](int slot, int64_t k0) {
    if constexpr (kFactored) {
      uint8_t* base = codes + slot * code_stage(BITS);
#pragma unroll
      for (int i = 0; i < kCopiesPerThread; ++i) {
        const int w = tid + i * kThreads;
        if (kCopies % kThreads != 0 && w >= kCopies) break;
        const bool ok = code_src[i] != nullptr;
        copy_or_zero_async<kUnit>(base + w * kUnit, ok ? code_src[i] + k0 * BITS / 8 : P.w.data, ok);
      }
      const uintptr_t at = scale_src + (static_cast<uintptr_t>(k0 >> scale_shift) << scale_size_log);
      copy_or_zero_async<4>(scale_words + slot * kScaleStage + tid,
                            scale_src != 0 ? reinterpret_cast<const void*>(at & ~uintptr_t{3}) : P.w.data,
                            scale_src != 0);
    }
  };
  // Affine: stage `slot`'s codes (every thread's copies landed and a barrier passed) into code tile `buf`,
  // each thread the chunks it would stage, and the rows' scales and offsets.
  auto convert_codes = [&](int slot, int buf, int64_t k0) {
    if constexpr (kFactored) {
      constexpr float kOffset = static_cast<float>(1 << (BITS - 1));
      const uint8_t* base = codes + slot * code_stage(BITS);
#pragma unroll
      for (int i = 0; i < kChunks; ++i) {
        const int c = tid + i * kThreads;
        const uint64_t v = affine_codes8<BITS, false>(base + (c >> 2) * (kBK * BITS / 8), c & 3);
        *reinterpret_cast<uint4*>(wh + buf * kWStage + (c >> 2) * kWPitch + (c & 3) * 8) =
            centred_codes<BITS>(v);
      }
      if (tid < kBN) {
        // A 16-bit value sits in the upper half of its word when its address is 2 past a multiple of 4:
        // group 0's offset bit, flipped by odd groups.
        const int odd = static_cast<int>((k0 >> row_shift) & 1);
        const uint32_t* words = scale_words + slot * kScaleStage + 2 * tid;
        const float sc = scale_from_word(row_dtype, words[0], ((row_halves & 1) ^ odd) != 0);
        const float bias = scale_from_word(row_dtype, words[1], (((row_halves >> 1) & 1) ^ odd) != 0);
        s_scale[buf][tid] = sc;
        s_offset[buf][tid] = fmaf(kOffset, sc, bias);
      }
    }
  };
  auto load_w_direct = [&](int stage, int64_t k0) {
    uint16_t* base = wh + stage * kWStage;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = tid + i * kThreads;
      const int64_t k = k0 + (c & 3) * 8;
      const int64_t n = src[0].n + i * kRowStep;
      const bool ok = n < src[0].m->rows && k < K;
      const uint16_t* s =
          ok ? static_cast<const uint16_t*>(src[0].data) + n * K + k : static_cast<const uint16_t*>(P.w.data);
      copy_or_zero_async<16>(base + (c >> 2) * kWPitch + (c & 3) * 8, s, ok);
    }
  };
  // Decoding formats: raw loads (or, for run-time formats, decoded weights) kept in registers for a stage.
  RawW8 raw[kChunks];
  float wdec[FMT == kAnyFmt ? kChunks : 1][8];
  bool wok[kChunks];
  auto fetch_w = [&](int64_t k0) {
    if constexpr (!kDirect) {
#pragma unroll
      for (int i = 0; i < kChunks; ++i) {
        const int c = tid + i * kThreads;
        const int64_t chunk = k0 / 8 + (c & 3);
        wok[i] = src[i].ok && chunk * 8 < K;
        if (!wok[i]) continue;
        if constexpr (FMT == kAnyFmt) {
          load_w8_any(*src[i].m, src[i].data, src[i].scales, src[i].biases, src[i].n, chunk, wdec[i]);
        } else {
          raw[i] =
              load_raw8<FMT, BITS>(*src[i].m, src[i].data, src[i].scales, src[i].biases, src[i].n, chunk);
        }
      }
    }
  };
  auto store_w = [&](int stage) {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = tid + i * kThreads;
      float w[8] = {};
      if (wok[i]) {
        if constexpr (FMT == kAnyFmt) {
#pragma unroll
          for (int q = 0; q < 8; ++q) w[q] = wdec[i][q];
        } else if constexpr (!kDirect) {
          decode8<FMT, BITS>(raw[i], w);
        }
      }
      uint4 hi, lo;
      split_pair(w[0], w[1], &hi.x, &lo.x);
      split_pair(w[2], w[3], &hi.y, &lo.y);
      split_pair(w[4], w[5], &hi.z, &lo.z);
      split_pair(w[6], w[7], &hi.w, &lo.w);
      const int at = stage * kWStage + (c >> 2) * kWPitch + (c & 3) * 8;
      *reinterpret_cast<uint4*>(wh + at) = hi;
      *reinterpret_cast<uint4*>(wl + at) = lo;
    }
  };
  (void)raw;
  (void)wdec;

  const int warp = tid >> 5, lane = tid & 31;
  const int wm = warp >> 2, wn = warp & 3;  // 32 activation rows x kWN weight rows of the tile
  const int g = lane >> 2, t4 = lane & 3;
  float acc[2][kNI][4] = {};
  // Affine: the open group's code sums and, for the thread's four rows, its activation sum.
  float gacc[kFactored ? 2 : 1][kFactored ? kNI : 1][4] = {};
  float gsum[2][2] = {};
  (void)gacc;
  (void)gsum;

  auto compute = [&](int stage, int buf) {
    const uint16_t* xhb = ah_s + buf * kAStage;
    const uint16_t* xlb = al_s + buf * kAStage;
    const uint16_t* hb = wh + stage * kWStage;
    const uint16_t* lb = wl + stage * kWStage;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t ah[2][4], al[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        // Matrices 0..3: (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
        const int at = (wm * 32 + mi * 16 + (lane & 15)) * kAPitch + kk + (lane >> 4) * 8;
        ldmatrix_x4(ah[mi], xhb + at);
        ldmatrix_x4(al[mi], xlb + at);
      }
      uint32_t bh[kNI][2], bl[kSplit ? kNI : 1][2];
      (void)bl;
#pragma unroll
      for (int pr = 0; pr < kNI / 2; ++pr) {
        // Matrices 0..3 of ldmatrix.x4: (n tile 2 pr, k 0-7), (2 pr, k 8-15), (2 pr + 1, k 0-7), (2 pr + 1,
        // k 8-15); lanes 8q..8q+7 address the rows of matrix q.
        const int row = wn * kWN + pr * 16 + (lane >> 4) * 8 + (lane & 7);
        const int col = kk + ((lane >> 3) & 1) * 8;
        uint32_t r[4];
        ldmatrix_x4(r, hb + row * kWPitch + col);
        bh[2 * pr][0] = r[0], bh[2 * pr][1] = r[1], bh[2 * pr + 1][0] = r[2], bh[2 * pr + 1][1] = r[3];
        if constexpr (kSplit) {
          ldmatrix_x4(r, lb + row * kWPitch + col);
          bl[2 * pr][0] = r[0], bl[2 * pr][1] = r[1], bl[2 * pr + 1][0] = r[2], bl[2 * pr + 1][1] = r[3];
        }
      }
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
        for (int ni = 0; ni < kNI; ++ni) {
          float* d = kFactored ? gacc[kFactored ? mi : 0][kFactored ? ni : 0] : acc[mi][ni];
          mma_bf16(d, ah[mi], bh[ni]);
          mma_bf16(d, al[mi], bh[ni]);
          if constexpr (kSplit) mma_bf16(acc[mi][ni], ah[mi], bl[ni]);
        }
      }
    }
    (void)lb;
  };
  // Affine: adds the stage's activation sums to the group's; at the group's last stage, scales the group
  // into the outputs and opens the next. A gate/up pair's groups end at the smaller group size. Group sizes
  // are 32, 64 or 128 (validate_matrix), so fold_stages is 1, 2 or 4.
  const int fold_stages = [&] {
    const int gs = DUAL && P.w2.group_size < P.w.group_size ? P.w2.group_size : P.w.group_size;
    return gs > kBK ? gs / kBK : 1;
  }();
  auto fold = [&](int kt) {
    if constexpr (kFactored) {
      const int buf = kt & 1;
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
        for (int half = 0; half < 2; ++half) gsum[mi][half] += s_xsum[buf][wm * 32 + mi * 16 + g + half * 8];
      }
      if (((kt + 1) & (fold_stages - 1)) != 0 && kt + 1 != kt_count) return;
#pragma unroll
      for (int ni = 0; ni < kNI; ++ni) {
        const int col = wn * kWN + ni * 8 + 2 * t4;
        const float2 sc = *reinterpret_cast<const float2*>(&s_scale[buf][col]);
        const float2 of = *reinterpret_cast<const float2*>(&s_offset[buf][col]);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float& y = acc[mi][ni][e];
            y = fmaf((e & 1) != 0 ? sc.y : sc.x, gacc[mi][ni][e], y);
            y = fmaf((e & 1) != 0 ? of.y : of.x, gsum[mi][e >> 1], y);
            gacc[mi][ni][e] = 0.0f;
          }
        }
      }
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) gsum[mi][0] = gsum[mi][1] = 0.0f;
    }
  };

  if constexpr (kFactored) {
    // Stage kt's codes become code tile kt % 2 in iteration kt - 1, after the barrier that shows every
    // thread's copies of them: so the copies run kAffineStages - 1 stages ahead and the conversion one.
#pragma unroll
    for (int s = 0; s < kAffineStages - 1; ++s) {
      if (s < kt_count) {
        load_x(s, static_cast<int64_t>(s) * kBK);
        load_codes(s, static_cast<int64_t>(s) * kBK);
      }
      copy_async_commit();
    }
    copy_async_wait<kAffineStages - 2>();
    __syncthreads();
    convert_codes(0, 0, 0);
    for (int kt = 0; kt < kt_count; ++kt) {
      copy_async_wait<kAffineStages - 3>();  // stages kt and kt + 1
      split_x(kt % kAffineStages, kt & 1);
      __syncthreads();  // code tile kt, stage kt + 1's codes and the split activations are visible
      const int next = kt + kAffineStages - 1;
      if (next < kt_count) {
        load_x(next % kAffineStages, static_cast<int64_t>(next) * kBK);
        load_codes(next % kAffineStages, static_cast<int64_t>(next) * kBK);
      }
      copy_async_commit();
      // Code tile (kt + 1) % 2 was last read by compute(kt - 1), before the barrier.
      if (kt + 1 < kt_count) {
        convert_codes((kt + 1) % kAffineStages, (kt + 1) & 1, static_cast<int64_t>(kt + 1) * kBK);
      }
      compute(kt & 1, kt & 1);
      fold(kt);
    }
  } else {
    // Prologue: the first kStages - 1 stages in flight (one commit group each, empty past the end).
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < kt_count) {
        load_x(s, static_cast<int64_t>(s) * kBK);
        if constexpr (kDirect) {
          load_w_direct(s, static_cast<int64_t>(s) * kBK);
        } else {
          fetch_w(static_cast<int64_t>(s) * kBK);
          store_w(s);
        }
      }
      copy_async_commit();
    }
    for (int kt = 0; kt < kt_count; ++kt) {
      copy_async_wait<kStages - 2>();
      split_x(kt % kStages, kt & 1);  // its buffer was last read by compute(kt - 2), before the last barrier
      __syncthreads();                // stage kt is visible; stage kt - 1 is no longer read
      const int next = kt + kStages - 1;
      const int ns = next % kStages;
      if (next < kt_count) {
        load_x(ns, static_cast<int64_t>(next) * kBK);
        if constexpr (kDirect) {
          load_w_direct(ns, static_cast<int64_t>(next) * kBK);
        } else {
          fetch_w(static_cast<int64_t>(next) * kBK);
        }
      }
      copy_async_commit();
      compute(kt % kStages, kt & 1);
      if constexpr (!kDirect) {
        if (next < kt_count) store_w(ns);
      }
    }
  }
  copy_async_wait<0>();
  pdl_launch_dependents();

  // Fragment c of n tile ni: row g (c0, c1) or g + 8 (c2, c3), tile columns 2 t4 and 2 t4 + 1.
  const int64_t N = P.w.rows;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int d = s_dst[wm * 32 + mi * 16 + g + half * 8];
      if (d < 0) continue;
      float* o = P.out + static_cast<int64_t>(d) * P.os;
#pragma unroll
      for (int ni = 0; ni < kNI; ++ni) {
        const float c0 = acc[mi][ni][2 * half], c1 = acc[mi][ni][2 * half + 1];
        const int col = wn * kWN + ni * 8 + 2 * t4;
        if constexpr (DUAL) {
          const int64_t f = static_cast<int64_t>(nt) * (kBN / 2) + (col >> 1);
          if (f < N) o[f] = siluf_(c0) * c1;
        } else {
          const int64_t n = static_cast<int64_t>(nt) * kBN + col;
          if (n < N) o[n] = j.accumulate ? o[n] + c0 : c0;
          if (n + 1 < N) o[n + 1] = j.accumulate ? o[n + 1] + c1 : c1;
        }
      }
    }
  }
}

template <int FMT, int BITS, bool DUAL, bool WIDE>
void launch_kernel(const MmaJob& j, dim3 grid, cudaStream_t stream) {
  launch_pdl(mma_kernel<FMT, BITS, DUAL, WIDE>, grid, dim3(kThreads), smem_bytes<FMT, BITS, WIDE>(), stream,
             j);
}

template <int FMT, int BITS, bool DUAL, bool WIDE>
void opt_in() {
  cudaFuncSetAttribute(mma_kernel<FMT, BITS, DUAL, WIDE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(smem_bytes<FMT, BITS, WIDE>()));
}

}  // namespace

void init_mma_kernels() {
  for (WFmt f : {WFmt::kF32, WFmt::kF16, WFmt::kBF16, WFmt::kAffine}) {
    for (int bits = 2; bits <= 8; ++bits) {
      if (f != WFmt::kAffine && bits > 2) break;
      with_format(f, bits, [](auto t) {
        opt_in<decltype(t)::kFmt, decltype(t)::kBits, false, false>();
        opt_in<decltype(t)::kFmt, decltype(t)::kBits, true, false>();
      });
    }
  }
  opt_in<static_cast<int>(WFmt::kBF16), 0, false, true>();
  opt_in<static_cast<int>(WFmt::kBF16), 0, true, true>();
  opt_in<kAnyFmt, 0, true, false>();
  mma_tma_available();  // its shared-memory opt-in too, before any step is recorded
}

void launch_mma(const MmaJob& j, int m_tiles, cudaStream_t stream) {
  if (j.parts <= 0 || m_tiles <= 0) return;
  const int n_tiles = j.part[j.parts - 1].n_tiles_end;
  if (n_tiles <= 0) return;
  const dim3 grid(static_cast<unsigned>(m_tiles), static_cast<unsigned>(n_tiles));
  const DevMatrix& w = j.part[0].w;
  if (j.tile_cols == kMmaColsWide) {  // bf16 weights (mma_tile_cols)
    if (j.dual) {
      launch_kernel<static_cast<int>(WFmt::kBF16), 0, true, true>(j, grid, stream);
    } else {
      launch_kernel<static_cast<int>(WFmt::kBF16), 0, false, true>(j, grid, stream);
    }
    return;
  }
  if (j.dual) {
    const DevMatrix& w2 = j.part[0].w2;
    if (w.fmt != w2.fmt || w.bits != w2.bits) {
      launch_kernel<kAnyFmt, 0, true, false>(j, grid, stream);
      return;
    }
    with_format(w.fmt, w.bits, [&](auto t) {
      launch_kernel<decltype(t)::kFmt, decltype(t)::kBits, true, false>(j, grid, stream);
    });
    return;
  }
  with_format(w.fmt, w.bits, [&](auto t) {
    launch_kernel<decltype(t)::kFmt, decltype(t)::kBits, false, false>(j, grid, stream);
  });
}

}  // namespace pd::cuda
