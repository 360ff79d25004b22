// Tensor-core products for prefill on Hopper's wgmma, fed by the tensor memory accelerator (kernels.h,
// "Tensor-core products for prefill"): the bf16 matrices that the matmul and matmuls ops multiply, in blocks
// of kRows activation rows x kCols weight rows. A split kernel first writes the activations as bf16 hi and lo
// arrays (split_pair, the split gemm_mma.cu makes per stage); then one producer thread copies stages of kK
// columns of hi, lo and the weights into 128-byte-swizzled shared tiles (cp.async.bulk.tensor, one mbarrier
// per stage) and two consumer warpgroups, 64 rows each, issue m64n256k16 products from those tiles,
// releasing each stage once its products are done.
//
// Determinism: an output element is hi*w then lo*w for each k16 step in ascending order, accumulated in one
// register; it depends only on its activation row and weight row (rows and columns past the matrices are
// zeros from the copy engine), not on R or the row's place in its tile (docs/DESIGN.md §4.6).

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "puredrive/backend/cuda/common.cuh"
#include "puredrive/backend/cuda/gemm_tma_affine.h"
#include "puredrive/backend/cuda/moe_partition.h"
#include "puredrive/backend/cuda/tma_wgmma.cuh"

namespace pd::cuda {
namespace {

using namespace tma;

constexpr int kRows = 128;  // activation rows per block (two consumer warpgroups of 64)
constexpr int kCols = 256;  // weight rows per block: the instruction's N
constexpr int kK = 64;      // columns per stage: one 128-byte swizzle row of bf16
constexpr int kStages = 3;
constexpr int kThreads = 384;  // warpgroup 0 copies, 1 and 2 multiply
constexpr uint32_t kATile = kRows * kK * 2;
constexpr uint32_t kBTile = kCols * kK * 2;
constexpr uint32_t kStageBytes = 2 * kATile + kBTile;                     // hi, lo, weights
constexpr size_t kSmem = kStages * kStageBytes + 2 * kStages * 8 + 1024;  // tiles, barriers, alignment

struct TmaJob {                 // 64-byte aligned, as CUtensorMap is
  CUtensorMap hi, lo;           // activations [rows, K] bf16
  CUtensorMap w[kMmaMaxParts];  // each part's weights [N, K] bf16
  float* out[kMmaMaxParts];
  int64_t os[kMmaMaxParts];
  int64_t n[kMmaMaxParts];        // weight rows
  int n_tiles_end[kMmaMaxParts];  // cumulative kCols tiles
  int parts;
  int rows;
  int k_tiles;
  bool accumulate;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// A consumer warpgroup's products over k_tiles stages of the ring (stage s at smem + s * kStageBytesT; a_hi,
// a_lo and b: byte offsets of its activation tiles and weight rows in a stage): per k16 step hi then lo times
// the weights into one accumulator, then the stage goes back to the producer. Waiting for a stage's products
// only after issuing the next stage's (wait_group 1) makes ptxas serialise them (C7515); the other
// warpgroup's products fill the gap.
template <int kStagesT, uint32_t kStageBytesT, int N>
__device__ __forceinline__ void multiply(float (&acc)[N], const uint8_t* smem, uint64_t* full,
                                         uint64_t* empty, int k_tiles, uint32_t a_hi, uint32_t a_lo,
                                         uint32_t b) {
  static_assert(N == 64 || N == 128, "m64n128k16 or m64n256k16 accumulators");
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int s = kt % kStagesT;
    wait_stage(&full[s], static_cast<uint32_t>((kt / kStagesT) & 1));
    const uint32_t base = smem_addr(smem + s * kStageBytesT);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kK / 16; ++kk) {
      const uint64_t w = tile_desc(base + b + 32 * kk);
      if constexpr (N == 128) {
        wgmma_m64n256k16(acc, tile_desc(base + a_hi + 32 * kk), w);
        wgmma_m64n256k16(acc, tile_desc(base + a_lo + 32 * kk), w);
      } else {
        wgmma_m64n128k16(acc, tile_desc(base + a_hi + 32 * kk), w);
        wgmma_m64n128k16(acc, tile_desc(base + a_lo + 32 * kk), w);
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
    if ((threadIdx.x & 31) == 0) mbar_arrive(&empty[s]);
  }
  fence_registers(acc);
}
#endif

__global__ void __launch_bounds__(kThreads, 1) tma_mma_kernel(const __grid_constant__ TmaJob j) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* const smem = ring_base(smem_raw);
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* const empty = full + kStages;
  int p = 0, nt = 0;
  block_part(static_cast<int>(blockIdx.y), j.n_tiles_end, j.parts, &p, &nt);
  const int m0 = static_cast<int>(blockIdx.x) * kRows;
  const int tid = static_cast<int>(threadIdx.x);
  init_stages(full, empty, kStages);
  __syncthreads();
  pdl_wait();  // the split activations

  if (tid < 128) {
    if (tid == 0) {
      for (int kt = 0; kt < j.k_tiles; ++kt) {
        const int s = acquire_stage(full, empty, kt, kStages, kStageBytes);
        uint8_t* const stage = smem + s * kStageBytes;
        tma_load(stage, &j.hi, kt * kK, m0, &full[s]);
        tma_load(stage + kATile, &j.lo, kt * kK, m0, &full[s]);
        tma_load(stage + 2 * kATile, &j.w[p], kt * kK, nt * kCols, &full[s]);
      }
    }
    pdl_launch_dependents();
    return;
  }

  const int wg = tid / 128 - 1;  // consumer warpgroup: activation rows 64 wg .. 64 wg + 63 of the tile
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
  multiply<kStages, kStageBytes>(acc, smem, full, empty, j.k_tiles, wg * (kATile / 2),
                                 wg * (kATile / 2) + kATile, 2 * kATile);
  pdl_launch_dependents();

  // Accumulator 4 i + e of a thread (warp w of its warpgroup, lane = 4 g + t): row 16 w + g (+ 8 for e >= 2),
  // column 8 i + 2 t (+ 1 for odd e), as in mma.sync's fragments.
  const int lane = tid & 31, warp = (tid >> 5) & 3;
  const int g = lane >> 2, t4 = lane & 3;
  const int64_t N = j.n[p];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = m0 + wg * 64 + warp * 16 + g + half * 8;
    if (row >= j.rows) continue;
    float* o = j.out[p] + static_cast<int64_t>(row) * j.os[p];
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int64_t n = static_cast<int64_t>(nt) * kCols + 8 * i + 2 * t4;
      const float c0 = acc[4 * i + 2 * half], c1 = acc[4 * i + 2 * half + 1];
      if (n < N) o[n] = j.accumulate ? o[n] + c0 : c0;
      if (n + 1 < N) o[n + 1] = j.accumulate ? o[n + 1] + c1 : c1;
    }
  }
#endif
}

// Four activations as bf16 hi and lo (split_pair) at hi and lo.
__device__ __forceinline__ void split_quad(const float* src, uint16_t* hi, uint16_t* lo) {
  uint2 h, l;
  split_pair(src[0], src[1], &h.x, &l.x);
  split_pair(src[2], src[3], &h.y, &l.y);
  *reinterpret_cast<uint2*>(hi) = h;
  *reinterpret_cast<uint2*>(lo) = l;
}

// x [rows, K] (row stride xs) into bf16 hi and lo arrays [rows, K]: four columns per thread.
__global__ void split_rows_kernel(const float* x, int64_t xs, int rows, int64_t K, uint16_t* hi,
                                  uint16_t* lo) {
  pdl_enter();
  const int64_t quads = K / 4;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * quads) return;
  const int64_t r = i / quads, k = (i % quads) * 4;
  split_quad(x + r * xs + k, hi + r * K + k, lo + r * K + k);
}

// The MoE products (grouped experts, gate/up pairs): blocks of kGRows activation rows (one 64-row tile of an
// expert's entries, or of a plain part's rows) x 256 weight rows, the two consumer warpgroups each on 128 of
// them (m64n128k16) over the same activation tile. A gate/up pair's block covers 128 outputs: warpgroup w's
// 128 weight rows are gate rows 64 w .. 64 w + 63 then the same up rows, so a thread holds the gate and up
// sums of its outputs (accumulators 4 i + e and 4 (i + 8) + e). A grouped part's activations were gathered
// into its tiles' rows first (gather_split_kernel), so the copy engine reads a tile as one box.
constexpr int kGRows = 64;
constexpr int kGStages = 4;
constexpr uint32_t kGATile = kGRows * kK * 2;
constexpr uint32_t kGBox = 64 * kK * 2;  // 64 weight rows
constexpr uint32_t kGStageBytes = 2 * kGATile + 4 * kGBox;
constexpr size_t kGSmem = kGStages * kGStageBytes + 2 * kGStages * 8 + 1024;
constexpr int kMoeParts = 2;  // the routed experts' part and the shared expert's

struct TmaMoeJob {                           // 64-byte aligned, as CUtensorMap is
  CUtensorMap hi[kMoeParts], lo[kMoeParts];  // each part's activations (grouped: gathered)
  CUtensorMap w[kMoeParts], w2[kMoeParts];   // [experts, N, K] (plain: one expert); w2: up of a pair
  float* out[kMoeParts];
  int64_t os[kMoeParts];
  int64_t n[kMoeParts];  // rows of one expert's matrix
  int n_tiles_end[kMoeParts];
  int rows[kMoeParts];  // plain parts
  bool grouped[kMoeParts];
  const int* list;
  int64_t list_stride;
  const int* count;
  const int* tile_start;
  int experts;
  int k_tiles[kMoeParts];  // the parts' columns may differ (the shared expert's width)
  int parts;
  bool dual;
  bool accumulate;
};

__global__ void __launch_bounds__(kThreads, 1) tma_moe_kernel(const __grid_constant__ TmaMoeJob j) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* const smem = ring_base(smem_raw);
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem + kGStages * kGStageBytes);
  uint64_t* const empty = full + kGStages;
  __shared__ int s_dst[kGRows];
  // Grid x runs over the weight-row tiles, so the blocks of one activation tile run together: the tile comes
  // from DRAM once (x over the activation tiles re-read every tile of the gathered rows, over 100 MB, once
  // per weight tile), and an expert's tiles are neighbours too, so its weights come from DRAM about once.
  int p = 0, nt = 0;
  block_part(static_cast<int>(blockIdx.x), j.n_tiles_end, j.parts, &p, &nt);
  const int t = static_cast<int>(blockIdx.y);
  const int tid = static_cast<int>(threadIdx.x);
  init_stages(full, empty, kGStages);
  pdl_wait();  // the activations, and a grouped part's lists
  RowTile rt;
  if (!row_tile(j.grouped[p], t, kGRows, j.rows[p], j.tile_start, j.count, j.experts, &rt)) return;
  if (tid < kGRows) s_dst[tid] = row_tile_dst(rt, j.grouped[p], j.list, j.list_stride, tid);
  __syncthreads();  // s_dst and the barriers

  if (tid < 128) {
    if (tid == 0) {
      const int w0 = nt * (j.dual ? 128 : 256);  // of the expert's matrix (rows past it read as zeros)
      for (int kt = 0; kt < j.k_tiles[p]; ++kt) {
        const int s = acquire_stage(full, empty, kt, kGStages, kGStageBytes), k = kt * kK;
        uint8_t* const stage = smem + s * kGStageBytes;
        uint8_t* const b = stage + 2 * kGATile;
        tma_load(stage, &j.hi[p], k, t * kGRows, &full[s]);
        tma_load(stage + kGATile, &j.lo[p], k, t * kGRows, &full[s]);
        for (int q = 0; q < 4; ++q) {
          // A pair: gate 0-63, up 0-63, gate 64-127, up 64-127; else weight rows 64 q .. 64 q + 63.
          const CUtensorMap* map = j.dual && (q & 1) != 0 ? &j.w2[p] : &j.w[p];
          tma_load(b + q * kGBox, map, k, w0 + (j.dual ? 64 * (q >> 1) : 64 * q), rt.expert, &full[s]);
        }
      }
    }
    pdl_launch_dependents();
    return;
  }

  const int wg = tid / 128 - 1;  // consumer warpgroup: weight rows 128 wg .. 128 wg + 127 of the block's
  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
  multiply<kGStages, kGStageBytes>(acc, smem, full, empty, j.k_tiles[p], 0, kGATile,
                                   2 * kGATile + wg * 2 * kGBox);
  pdl_launch_dependents();

  const int lane = tid & 31, warp = (tid >> 5) & 3;
  const int g = lane >> 2, t4 = lane & 3;
  const int64_t N = j.n[p];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int d = s_dst[warp * 16 + g + half * 8];
    if (d < 0) continue;
    float* o = j.out[p] + static_cast<int64_t>(d) * j.os[p];
    if (j.dual) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t f = static_cast<int64_t>(nt) * 128 + wg * 64 + 8 * i + 2 * t4 + e;
          if (f < N) o[f] = siluf_(acc[4 * i + 2 * half + e]) * acc[4 * (i + 8) + 2 * half + e];
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t n = static_cast<int64_t>(nt) * 256 + wg * 128 + 8 * i + 2 * t4 + e;
          const float c = acc[4 * i + 2 * half + e];
          if (n < N) o[n] = j.accumulate ? o[n] + c : c;
        }
      }
    }
  }
#endif
}

// A grouped part's activations as bf16 hi and lo rows in its tiles' order: row 64 t + i holds entry i of tile
// t (its source row list[...] / list_div), zeros past the expert's entries. A block per row.
__global__ void gather_split_kernel(const float* x, int64_t xs, int64_t K, const int* list,
                                    int64_t list_stride, const int* count, const int* tile_start, int experts,
                                    int list_div, uint16_t* hi, uint16_t* lo) {
  pdl_enter();
  const int row = static_cast<int>(blockIdx.x);
  const float* src = nullptr;
  if (!gathered_source(x, xs, list, list_stride, count, tile_start, experts, list_div, row, kGRows, &src))
    return;
  for (int64_t k = static_cast<int64_t>(threadIdx.x) * 4; k < K; k += static_cast<int64_t>(blockDim.x) * 4) {
    if (src != nullptr) {
      split_quad(src + k, hi + row * K + k, lo + row * K + k);
    } else {
      *reinterpret_cast<uint2*>(hi + row * K + k) = make_uint2(0, 0);
      *reinterpret_cast<uint2*>(lo + row * K + k) = make_uint2(0, 0);
    }
  }
}

using EncodeTiled = PFN_cuTensorMapEncodeTiled_v12000;

EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

// A bf16 tensor of `rank` dimensions read in 128-byte-swizzled boxes (encode_tensor_map).
bool encode_map(CUtensorMap* map, cuuint32_t rank, const void* data, const cuuint64_t* dims,
                const cuuint64_t* strides, const cuuint32_t* box) {
  return encode_tensor_map(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, data, dims, strides, box,
                           CU_TENSOR_MAP_SWIZZLE_128B);
}

// A bf16 matrix [rows, cols] (rows of cols elements, contiguous) read in boxes of box_rows x kK.
bool tile_map(CUtensorMap* map, const void* data, int64_t rows, int64_t cols, int box_rows) {
  return encode_bf16_tile_map(map, data, rows, cols, cols, kK, box_rows);
}

// Stacked experts [experts, rows, cols] (data_stride bytes apart) read in boxes of 64 rows x kK of one
// expert; rows past an expert's matrix read as zeros.
bool tile_map_experts(CUtensorMap* map, const DevMatrix& w, int experts) {
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(w.cols), static_cast<cuuint64_t>(w.rows),
                              static_cast<cuuint64_t>(experts)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(w.cols) * 2,
                                 static_cast<cuuint64_t>(experts > 1 ? w.data_stride : w.rows * w.cols * 2)};
  const cuuint32_t box[3] = {kK, 64, 1};
  return encode_map(map, 3, w.data, dims, strides, box);
}

bool device_has_wgmma() {
#if defined(PD_CUDA_SM90A)
  static const bool ok = [] {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return major == 9 && minor == 0 && encode_tiled() != nullptr &&
           cudaFuncSetAttribute(tma_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(kSmem)) == cudaSuccess &&
           cudaFuncSetAttribute(tma_moe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(kGSmem)) == cudaSuccess &&
           opt_in_affine_tma();
  }();
  return ok;
#else
  return false;
#endif
}

// Weights the copy engine can read as they are: bf16, rows (and stacked experts) 16-byte aligned.
bool tma_matrix(const DevMatrix& w, bool grouped) {
  return w.fmt == WFmt::kBF16 && w.cols % 8 == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0 &&
         (!grouped || w.data_stride % 16 == 0);
}

// Plain bf16 parts on one activation input: the 128 x 256 kernel.
bool dense_job(const MmaJob& j) {
  if (j.dual) return false;
  const MmaPart& first = j.part[0];
  for (int i = 0; i < j.parts; ++i) {
    const MmaPart& p = j.part[i];
    if (p.grouped || !tma_matrix(p.w, false) || p.w.cols != first.w.cols || p.x != first.x ||
        p.xs != first.xs || p.rows != first.rows) {
      return false;
    }
  }
  return true;
}

// Grouped experts and gate/up pairs, at most two parts: the 64-row kernel.
bool moe_job(const MmaJob& j) {
  if (j.parts > kMoeParts) return false;
  for (int i = 0; i < j.parts; ++i) {
    const MmaPart& p = j.part[i];
    if (!tma_matrix(p.w, p.grouped) ||
        (j.dual && (!tma_matrix(p.w2, p.grouped) || p.w2.rows != p.w.rows || p.w2.cols != p.w.cols))) {
      return false;
    }
  }
  return true;
}

// Activation rows a part's hi and lo arrays hold: a grouped part's gathered tiles, or its own rows.
int64_t split_rows(const MmaPart& p, int m_tiles) {
  return p.grouped ? int64_t{m_tiles} * kGRows : p.rows;
}

void launch_dense(const MmaJob& j, void* scratch, cudaStream_t stream) {
  const MmaPart& first = j.part[0];
  const int rows = first.rows;
  const int64_t K = first.w.cols;
  auto* hi = static_cast<uint16_t*>(scratch);
  uint16_t* lo = hi + static_cast<int64_t>(rows) * K;
  TmaJob t{};
  bool ok = tile_map(&t.hi, hi, rows, K, kRows) && tile_map(&t.lo, lo, rows, K, kRows);
  int tiles = 0;
  for (int i = 0; i < j.parts; ++i) {
    const MmaPart& p = j.part[i];
    ok = ok && tile_map(&t.w[i], p.w.data, p.w.rows, K, kCols);
    t.out[i] = p.out;
    t.os[i] = p.os;
    t.n[i] = p.w.rows;
    tiles += static_cast<int>((p.w.rows + kCols - 1) / kCols);
    t.n_tiles_end[i] = tiles;
  }
  if (!ok) tensor_map_failed();
  t.parts = j.parts;
  t.rows = rows;
  t.k_tiles = static_cast<int>((K + kK - 1) / kK);
  t.accumulate = j.accumulate;
  const int64_t quads = static_cast<int64_t>(rows) * (K / 4);
  launch_pdl(split_rows_kernel, dim3(static_cast<unsigned>((quads + 255) / 256)), dim3(256), 0, stream,
             first.x, first.xs, rows, K, hi, lo);
  launch_pdl(tma_mma_kernel,
             dim3(static_cast<unsigned>((rows + kRows - 1) / kRows), static_cast<unsigned>(tiles)),
             dim3(kThreads), kSmem, stream, t);
}

void launch_moe(const MmaJob& j, int m_tiles, void* scratch, cudaStream_t stream) {
  TmaMoeJob t{};
  auto* at = static_cast<uint16_t*>(scratch);
  bool ok = true;
  int tiles = 0;
  for (int i = 0; i < j.parts; ++i) {
    const MmaPart& p = j.part[i];
    const int64_t K = p.w.cols, rows = split_rows(p, m_tiles);
    uint16_t* hi = at;
    uint16_t* lo = hi + rows * K;
    at = lo + rows * K;
    ok = ok && tile_map(&t.hi[i], hi, rows, K, kGRows) && tile_map(&t.lo[i], lo, rows, K, kGRows) &&
         tile_map_experts(&t.w[i], p.w, p.grouped ? j.experts : 1) &&
         (!j.dual || tile_map_experts(&t.w2[i], p.w2, p.grouped ? j.experts : 1));
    t.out[i] = p.out;
    t.os[i] = p.os;
    t.n[i] = p.w.rows;
    tiles += static_cast<int>((p.w.rows + (j.dual ? 127 : 255)) / (j.dual ? 128 : 256));
    t.n_tiles_end[i] = tiles;
    t.rows[i] = p.rows;
    t.grouped[i] = p.grouped;
    t.k_tiles[i] = static_cast<int>((K + kK - 1) / kK);
    if (p.grouped) {
      launch_pdl(gather_split_kernel, dim3(static_cast<unsigned>(rows)), dim3(128), 0, stream, p.x, p.xs, K,
                 j.list, j.list_stride, j.count, j.tile_start, j.experts, p.list_div, hi, lo);
    } else if (p.rows > 0) {
      const int64_t quads = int64_t{p.rows} * (K / 4);
      launch_pdl(split_rows_kernel, dim3(static_cast<unsigned>((quads + 255) / 256)), dim3(256), 0, stream,
                 p.x, p.xs, p.rows, K, hi, lo);
    }
  }
  if (!ok) tensor_map_failed();
  t.list = j.list;
  t.list_stride = j.list_stride;
  t.count = j.count;
  t.tile_start = j.tile_start;
  t.experts = j.experts;
  t.parts = j.parts;
  t.dual = j.dual;
  t.accumulate = j.accumulate;
  launch_pdl(tma_moe_kernel, dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(m_tiles)),
             dim3(kThreads), kGSmem, stream, t);
}

}  // namespace

void tensor_map_failed() {
  std::fprintf(stderr, "puredrive: cuTensorMapEncodeTiled failed\n");
  std::abort();
}

bool encode_tensor_map(CUtensorMap* map, CUtensorMapDataType type, uint32_t rank, const void* data,
                       const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                       CUtensorMapSwizzle swizzle) {
  const cuuint32_t steps[3] = {1, 1, 1};
  return encode_tiled()(map, type, rank, const_cast<void*>(data), dims, strides, box, steps,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

bool encode_bf16_tile_map(CUtensorMap* map, const void* data, int64_t rows, int64_t cols, int64_t row_stride,
                          int box_cols, int box_rows) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_stride) * 2};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  return encode_map(map, 2, data, dims, strides, box);
}

bool wgmma_available() {
  return device_has_wgmma();
}

bool mma_tma_available() {
  static const bool on = env_switch_on("PD_MMA_TMA");
  return on && device_has_wgmma();
}

bool mma_tma_takes(const MmaJob& j) {
  return j.parts > 0 && mma_tma_available() && (dense_job(j) || moe_job(j) || affine_tma_job(j));
}

int64_t mma_tma_part_bytes(int64_t rows, int64_t K) {
  return std::max(4 * rows * K, affine_tma_part_bytes(rows, K));
}

int64_t mma_tma_scratch_bytes(const MmaJob& j, int m_tiles) {
  if (affine_tma_job(j)) return affine_tma_scratch_bytes(j, m_tiles);
  if (dense_job(j)) return int64_t{4} * j.part[0].rows * j.part[0].w.cols;
  int64_t bytes = 0;
  for (int i = 0; i < j.parts; ++i) bytes += 4 * split_rows(j.part[i], m_tiles) * j.part[i].w.cols;
  return bytes;
}

void launch_mma_tma(const MmaJob& j, int m_tiles, void* scratch, cudaStream_t stream) {
  if (j.parts <= 0 || m_tiles <= 0) return;
  if (affine_tma_job(j)) {
    launch_affine_tma(j, m_tiles, scratch, stream);
  } else if (dense_job(j)) {
    if (j.part[0].rows > 0) launch_dense(j, scratch, stream);
  } else {
    launch_moe(j, m_tiles, scratch, stream);
  }
}

}  // namespace pd::cuda
