// Prefill products of affine weights on Hopper's wgmma (kernels.h, "Tensor-core products for prefill";
// docs/DESIGN.md §8). The copy engine brings each stage's codes (as stored), the activations' bf16 hi and lo
// tiles (arrays a split kernel writes first) and their group sums into a ring of shared memory; one producer
// warp issues the copies kStages deep. Each consumer thread turns its weight rows' codes into register
// fragments of centred codes q - 2^(b-1) (exact in bf16), the A operand, while the tensor cores multiply the
// stage before; the activations are B. A block is kWRows weight rows (two consumer warpgroups of 64) x kARows
// activation rows (a 64-row tile of an expert's entries, or of a plain part's rows). In a gate/up pair's
// block each warp's 16 weight rows are 8 gate rows and the same 8 up rows, so a thread holds both sums of its
// outputs.
//
// Each group of fs columns (the smallest group size among the part's matrices) is multiplied into a fresh
// accumulator g, then folded into the output: y += s g, then y += (b + o s) sum(x), with sum(x) the group's
// f32 activation sum (split kernel, a fixed tree).
//
// Determinism: an output element is, group by group in ascending order, the products hi*c then lo*c of the
// group's k16 steps in ascending order in one register, then the two fold terms. It depends only on its
// activation row and weight row (zero rows and columns pad the tiles), not on R or on the tile a row lands
// in.
//
// Register operands: a wgmma reads them while it runs, and PTX leaves writing them before the covering
// wgmma_wait undefined; ptxas then does give them to later instructions (a first version built the next
// stage's fragments into the registers in flight, and its results varied from run to run). Two fragment
// sets, alternating by stage, keep every write behind its wait; bench/device/wgmma_hazards.py checks the
// SASS for any instruction that writes an in-flight operand register.

#include "puredrive/backend/cuda/gemm_tma_affine.h"

#include <cuda.h>

#include <algorithm>
#include <type_traits>

#include "puredrive/backend/cuda/common.cuh"
#include "puredrive/backend/cuda/gemm_mma_tiles.cuh"
#include "puredrive/backend/cuda/moe_partition.h"
#include "puredrive/backend/cuda/tma_wgmma.cuh"

namespace pd::cuda {
namespace {

using namespace tma;

constexpr int kARows = kMmaRows;  // activation rows per block: a grouped part's row tile
constexpr int kWRows = 128;       // weight rows per block (a gate/up pair: 64 outputs)
constexpr int kK = 64;            // columns per stage
constexpr int kStages = 6;
constexpr int kConsumers = 256;  // two warpgroups; warp 8 copies
constexpr int kThreads = kConsumers + 32;
constexpr uint32_t kXTile = kARows * kK * 2;   // bf16 hi or lo
constexpr uint32_t kSumTile = 2 * kARows * 4;  // two rows of activation sums

constexpr uint32_t code_box(int bits) {  // 64 weight rows' codes of a stage
  return 64 * kK * bits / 8;
}
constexpr uint32_t stage_tx(int bits) {  // the bytes a stage's copies bring
  return 2 * kXTile + 2 * code_box(bits) + kSumTile;
}
constexpr uint32_t stage_bytes(int bits) {  // swizzled tiles start 1024-byte aligned
  return (stage_tx(bits) + 1023) / 1024 * 1024;
}
constexpr size_t smem_bytes(int bits) {  // the ring, barriers, alignment
  return kStages * stage_bytes(bits) + 2 * kStages * 8 + 1024;
}

struct AffineScales {  // one matrix's scales and biases
  const uint8_t* scales;
  const uint8_t* biases;
  int64_t expert_stride;  // bytes
  int64_t row_bytes;      // a row's groups
  int64_t rows;
  int shift;  // log2 of the group size
  SDType dtype;
};

struct AffinePart {    // 64-byte aligned, as CUtensorMap is
  CUtensorMap hi, lo;  // activations [rows, K] bf16
  CUtensorMap sums;    // [K / fs, rows] f32: each group's activation sum
  CUtensorMap w, w2;   // codes [experts, N, K * bits / 8] bytes; w2: up of a pair
  AffineScales sw, sw2;
  float* out;
  int64_t os;
  int64_t n;  // rows of one expert's matrix (outputs)
  int64_t k;  // columns
  int rows;   // plain parts
  int k_tiles;
  int fs_shift;  // log2 of the fold size fs
  bool grouped;
};

struct AffineJob {
  AffinePart part[kMmaMaxParts];
  int n_tiles_end[kMmaMaxParts];
  const int* list;
  int64_t list_stride;
  const int* count;
  const int* tile_start;
  int experts;
  int parts;
  bool dual;
  bool accumulate;
};

template <int BITS>
__global__ void __launch_bounds__(kThreads, 1) tma_affine_kernel(const __grid_constant__ AffineJob j) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr uint32_t kBox = code_box(BITS), kStageBytes = stage_bytes(BITS);
  constexpr int kRowBytes = kK * BITS / 8;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* const smem = ring_base(smem_raw);
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* const empty = full + kStages;
  __shared__ int s_dst[kARows];
  // Grid x runs over the weight-row tiles, so the blocks of one activation tile run together (gemm_tma.cu).
  int p = 0, nt = 0;
  block_part(static_cast<int>(blockIdx.x), j.n_tiles_end, j.parts, &p, &nt);
  const AffinePart& P = j.part[p];
  const int t = static_cast<int>(blockIdx.y);
  const int tid = static_cast<int>(threadIdx.x);
  init_stages(full, empty, kStages);
  pdl_wait();  // the split activations, and a grouped part's lists
  RowTile rt;
  if (!row_tile(P.grouped, t, kARows, P.rows, j.tile_start, j.count, j.experts, &rt)) return;
  if (tid < kARows) s_dst[tid] = row_tile_dst(rt, P.grouped, j.list, j.list_stride, tid);
  __syncthreads();  // s_dst and the barriers

  if (tid >= kConsumers) {
    if (tid == kConsumers) {
      const int w0 = nt * (j.dual ? kWRows / 2 : kWRows);  // of the expert's matrix (rows past it: zeros)
      for (int kt = 0; kt < P.k_tiles; ++kt) {
        const int s = acquire_stage(full, empty, kt, kStages, stage_tx(BITS)), k = kt * kK;
        uint8_t* const stage = smem + s * kStageBytes;
        uint8_t* const codes = stage + 2 * kXTile;
        tma_load(stage, &P.hi, k, t * kARows, &full[s]);
        tma_load(stage + kXTile, &P.lo, k, t * kARows, &full[s]);
        // Code rows 0-63: w rows w0.., 64-127: the pair's up rows w0.. or w rows w0 + 64..
        tma_load(codes, &P.w, k * BITS / 8, w0, rt.expert, &full[s]);
        tma_load(codes + kBox, j.dual ? &P.w2 : &P.w, k * BITS / 8, j.dual ? w0 : w0 + 64, rt.expert,
                 &full[s]);
        tma_load(codes + 2 * kBox, &P.sums, t * kARows, k >> P.fs_shift, &full[s]);
      }
    }
    pdl_launch_dependents();
    return;
  }

  // Accumulator 4 i + 2 h + e of a thread (warp w of warpgroup wg, lane = 4 g + t4): weight row h of the
  // thread (16 w + g + 8 h of the warpgroup's 64), activation row 8 i + 2 t4 + e of the tile.
  const int wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int fs_shift = P.fs_shift;
  // The thread's two weight rows: their places among a stage's 128 code rows, and where their scales are.
  int code_row[2];
  const uint8_t* srow[2];
  const uint8_t* brow[2];
  int gshift[2];
  SDType sdt[2];
  bool live[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const AffineScales& m = j.dual && h == 1 ? P.sw2 : P.sw;
    const int f = j.dual ? 32 * wg + 8 * warp + g : 64 * wg + 16 * warp + 8 * h + g;
    code_row[h] = j.dual ? 64 * h + f : f;
    const int64_t n = static_cast<int64_t>(nt) * (j.dual ? kWRows / 2 : kWRows) + f;
    live[h] = n < m.rows;
    const int64_t at = rt.expert * m.expert_stride + n * m.row_bytes;
    srow[h] = m.scales + at;
    brow[h] = m.biases + at;
    gshift[h] = m.shift;
    sdt[h] = m.dtype;
  }
  // The rows' scale s and offset b + o s for the group holding column k (loaded a group ahead of its fold).
  auto offsets = [&](int64_t k, float(&sc)[2], float(&of)[2]) {
    constexpr float kOffset = static_cast<float>(1 << (BITS - 1));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sc[h] = 0.0f;
      of[h] = 0.0f;
      if (live[h] && k < P.k) {
        const int64_t gi = k >> gshift[h];
        sc[h] = scale_at(srow[h], sdt[h], gi);
        of[h] = fmaf(kOffset, sc[h], scale_at(brow[h], sdt[h], gi));
      }
    }
  };
  // Stage kt's A fragments: the codes of the thread's rows (h = 0, 1: 16 w + g + 8 h of the tile) in columns
  // 32 half + 8 t4 .. + 7, centred. In k16 step 2 half + e they fill the slots of k 2 t4, 2 t4 + 1 (codes 4
  // e, 4 e + 1) and 2 t4 + 8, 2 t4 + 9 (codes 4 e + 2, 4 e + 3): the split kernel stores the activations in
  // that order (split_affine_kernel), so each thread loads whole words of codes.
  auto build = [&](uint32_t(&f)[4][4], int kt) {
    const uint8_t* const codes = smem + (kt % kStages) * kStageBytes + 2 * kXTile;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint8_t* row = codes + code_row[h] * kRowBytes;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint4 u = gemm_tiles::centred_codes<BITS>(affine_codes8<BITS, false>(row, 4 * half + t4));
        f[2 * half][h] = u.x;
        f[2 * half][2 + h] = u.y;
        f[2 * half + 1][h] = u.z;
        f[2 * half + 1][2 + h] = u.w;
      }
    }
  };

  float acc[32], grp[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[i] = grp[i] = 0.0f;
  float sc[2], of[2], sc_next[2], of_next[2];
  const int fs = 1 << fs_shift;
  offsets(0, sc, of);
  offsets(fs, sc_next, of_next);
  int64_t k_ahead = 2 * fs;
  auto fold = [&](const float* sums) {  // sums: the group's activation sums of the tile's 64 rows
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float2 x = *reinterpret_cast<const float2*>(sums + 8 * i + 2 * t4);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float& y0 = acc[4 * i + 2 * h];
        float& y1 = acc[4 * i + 2 * h + 1];
        y0 = fmaf(sc[h], grp[4 * i + 2 * h], y0);
        y0 = fmaf(of[h], x.x, y0);
        y1 = fmaf(sc[h], grp[4 * i + 2 * h + 1], y1);
        y1 = fmaf(of[h], x.y, y1);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) sc[h] = sc_next[h], of[h] = of_next[h];
    offsets(k_ahead, sc_next, of_next);
    k_ahead += fs;
  };
  // Stage kt's products from fragments `cur`: kSubs groups of 32 columns (fs 32), else one pass (a group of
  // 64, or half of one of 128, which opens at even stages and folds at odd ones or the last). The next
  // stage's fragments go into `next` while the tensor cores work: two sets, so no register an in-flight
  // product reads is written before its wait.
  auto stage_products = [&](auto subs, int kt, uint32_t(&cur)[4][4], uint32_t(&next)[4][4]) {
    constexpr int kSubs = decltype(subs)::value;
    constexpr int kSteps = 4 / kSubs;
    const int s = kt % kStages;
    const uint8_t* const stage = smem + s * kStageBytes;
    const uint32_t x_base = smem_addr(stage);
    const float* const sums = reinterpret_cast<const float*>(stage + 2 * kXTile + 2 * kBox);
    const int open = kSubs == 2 || fs_shift == 6 || (kt & 1) == 0 ? 0 : 1;  // scale-d 0: a fresh group
    const bool closes = kSubs == 2 || fs_shift == 6 || (kt & 1) == 1 || kt + 1 == P.k_tiles;
#pragma unroll
    for (int sub = 0; sub < kSubs; ++sub) {
      wgmma_fence();
#pragma unroll
      for (int q = 0; q < kSteps; ++q) {
        const int kk = sub * kSteps + q;
        wgmma_m64n64k16_rs(grp, cur[kk], tile_desc(x_base + 32 * kk), q == 0 ? open : 1);
        wgmma_m64n64k16_rs(grp, cur[kk], tile_desc(x_base + kXTile + 32 * kk), 1);
      }
      wgmma_commit();
      const bool last = sub == kSubs - 1;
      if (last && kt + 1 < P.k_tiles) {
        wait_stage(&full[(kt + 1) % kStages], static_cast<uint32_t>(((kt + 1) / kStages) & 1));
        build(next, kt + 1);
      }
      wgmma_wait<0>();
      fence_registers(grp);
      if (closes) fold(sums + sub * kARows);
    }
    if (lane == 0) mbar_arrive(&empty[s]);
  };

  uint32_t fa[4][4], fb[4][4];
  wait_stage(&full[0], 0);
  build(fa, 0);
  auto products = [&](auto subs) {
    for (int kt = 0; kt < P.k_tiles; kt += 2) {
      stage_products(subs, kt, fa, fb);
      if (kt + 1 < P.k_tiles) stage_products(subs, kt + 1, fb, fa);
    }
  };
  if (fs_shift == 5) {
    products(std::integral_constant<int, 2>{});
  } else {
    products(std::integral_constant<int, 1>{});
  }
  pdl_launch_dependents();

#pragma unroll
  for (int i = 0; i < 8; ++i) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int d = s_dst[8 * i + 2 * t4 + e];
      if (d < 0) continue;
      float* o = P.out + static_cast<int64_t>(d) * P.os;
      if (j.dual) {
        const int64_t f = static_cast<int64_t>(nt) * (kWRows / 2) + 32 * wg + 8 * warp + g;
        if (f < P.n) o[f] = siluf_(acc[4 * i + e]) * acc[4 * i + 2 + e];
      } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t n = static_cast<int64_t>(nt) * kWRows + 64 * wg + 16 * warp + 8 * h + g;
          const float c = acc[4 * i + 2 * h + e];
          if (n < P.n) o[n] = j.accumulate ? o[n] + c : c;
        }
      }
    }
  }
#endif
}

// The activations a part's products read: bf16 hi and lo rows [rows, K] (columns in the products' order
// within each 32, below) and the f32 sum of each fs-column group (a tree: pairs within a thread's four
// columns, then neighbouring lanes) at sums[group * sum_stride + row]. A block per row: a grouped part's row
// 64 t + i holds entry i of row tile t (its source row list[...] / list_div), zeros past the expert's
// entries; a plain part's row r is x's row r.
struct AffineSplit {
  const float* x;
  int64_t xs;
  int64_t k;
  int fs_shift;
  int rows;         // plain
  const int* list;  // grouped (else null)
  int64_t list_stride;
  const int* count;
  const int* tile_start;
  int experts;
  int list_div;
  uint16_t* hi;
  uint16_t* lo;
  float* sums;
  int64_t sum_stride;
};

__global__ void __launch_bounds__(128) split_affine_kernel(const AffineSplit a) {
  pdl_enter();
  const int row = static_cast<int>(blockIdx.x);
  const float* src = nullptr;
  if (a.list != nullptr) {
    if (!gathered_source(a.x, a.xs, a.list, a.list_stride, a.count, a.tile_start, a.experts, a.list_div, row,
                         kARows, &src)) {
      return;
    }
  } else if (row < a.rows) {
    src = a.x + static_cast<int64_t>(row) * a.xs;
  }
  uint16_t* const hi = a.hi + static_cast<int64_t>(row) * a.k;
  uint16_t* const lo = a.lo + static_cast<int64_t>(row) * a.k;
  const int quads_per_group = 1 << (a.fs_shift - 2);
  // Every lane runs every pass (the shuffles need the whole warp); lanes past the row add zeros. Groups are
  // whole warps' aligned lanes: K is a multiple of fs.
  for (int64_t q0 = 0; q0 < a.k / 4; q0 += blockDim.x) {
    const int64_t q = q0 + threadIdx.x, k = 4 * q;
    float v[4] = {};
    if (src != nullptr && k < a.k) {
#pragma unroll
      for (int i = 0; i < 4; ++i) v[i] = src[k + i];
    }
    float sum = (v[0] + v[1]) + (v[2] + v[3]);
    for (int m = 1; m < quads_per_group; m <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, m);
    if (k < a.k) {
      // Columns k .. k + 3 (4 e + 8 t4 of their 32-column block) go where the products' k16 step 2 half + e
      // reads them with codes 4 e .. 4 e + 3 of thread t4 (tma_affine_kernel's build): k slots 2 t4, 2 t4 + 1
      // and 2 t4 + 8, 2 t4 + 9.
      const int64_t c = k & 31, at = (k - c) + 16 * ((c >> 2) & 1) + 2 * (c >> 3);
      uint32_t h0, l0, h1, l1;
      split_pair(v[0], v[1], &h0, &l0);
      split_pair(v[2], v[3], &h1, &l1);
      *reinterpret_cast<uint32_t*>(hi + at) = h0;
      *reinterpret_cast<uint32_t*>(hi + at + 8) = h1;
      *reinterpret_cast<uint32_t*>(lo + at) = l0;
      *reinterpret_cast<uint32_t*>(lo + at + 8) = l1;
      if ((q & (quads_per_group - 1)) == 0) a.sums[(k >> a.fs_shift) * a.sum_stride + row] = sum;
    }
  }
}

bool affine_matrix(const DevMatrix& w, int bits, bool grouped) {
  return w.fmt == WFmt::kAffine && w.bits == bits && (bits == 2 || bits == 4 || bits == 6 || bits == 8) &&
         (w.group_size == 32 || w.group_size == 64 || w.group_size == 128) && (w.cols * bits / 8) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && (!grouped || w.data_stride % 16 == 0);
}

int64_t round_up(int64_t v, int64_t m) {
  return (v + m - 1) / m * m;
}

// Where a part's activations go in the scratch, and their shape.
struct PartLayout {
  int64_t rows;  // of the hi and lo arrays
  int64_t k;
  int64_t sum_stride;
  int fs_shift;
  int64_t bytes() const { return rows * k * 4 + (k >> fs_shift) * sum_stride * 4; }
};

PartLayout part_layout(const MmaJob& j, const MmaPart& p, int m_tiles) {
  PartLayout l;
  const int fs = j.dual ? std::min(p.w.group_size, p.w2.group_size) : p.w.group_size;
  l.fs_shift = __builtin_ctz(static_cast<unsigned>(fs));
  l.k = p.w.cols;
  l.rows = p.grouped ? int64_t{m_tiles} * kARows : std::max(p.rows, 1);
  l.sum_stride = round_up(l.rows, 4);
  return l;
}

// An earlier part whose activations part i shares (a plain part of the same rows and layout), or -1.
int shared_split(const MmaJob& j, int i, int m_tiles) {
  const MmaPart& p = j.part[i];
  if (p.grouped) return -1;
  const PartLayout l = part_layout(j, p, m_tiles);
  for (int q = 0; q < i; ++q) {
    const MmaPart& o = j.part[q];
    const PartLayout lo = part_layout(j, o, m_tiles);
    if (!o.grouped && o.x == p.x && o.xs == p.xs && o.rows == p.rows && o.w.cols == p.w.cols &&
        lo.fs_shift == l.fs_shift) {
      return q;
    }
  }
  return -1;
}

AffineScales scales_of(const DevMatrix& m, bool grouped) {
  const int64_t size = m.scale_dtype == SDType::kF32 ? 4 : 2;
  AffineScales s;
  s.scales = static_cast<const uint8_t*>(m.scales);
  s.biases = static_cast<const uint8_t*>(m.biases);
  s.expert_stride = grouped ? m.scale_stride : 0;
  s.row_bytes = m.cols / m.group_size * size;
  s.rows = m.rows;
  s.shift = __builtin_ctz(static_cast<unsigned>(m.group_size));
  s.dtype = m.scale_dtype;
  return s;
}

// Codes [experts, rows, cols * bits / 8] bytes read in boxes of 64 rows x one stage of one expert.
bool code_map(CUtensorMap* map, const DevMatrix& w, int experts) {
  const int64_t row_bytes = w.cols * w.bits / 8;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(row_bytes), static_cast<cuuint64_t>(w.rows),
                              static_cast<cuuint64_t>(experts)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(row_bytes),
                                 static_cast<cuuint64_t>(experts > 1 ? w.data_stride : w.rows * row_bytes)};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(kK * w.bits / 8), 64, 1};
  return encode_tensor_map(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, w.data, dims, strides, box,
                           CU_TENSOR_MAP_SWIZZLE_NONE);
}

// The group sums [groups, rows] (sum_stride apart) read in boxes of 64 rows x 2 groups.
bool sum_map(CUtensorMap* map, const float* sums, const PartLayout& l) {
  // Past the last group (a stage of two 32-column groups reaching past K) the box reads zeros.
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(l.rows), static_cast<cuuint64_t>(l.k >> l.fs_shift)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(l.sum_stride * 4)};
  const cuuint32_t box[2] = {kARows, 2};
  return encode_tensor_map(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, sums, dims, strides, box,
                           CU_TENSOR_MAP_SWIZZLE_NONE);
}

template <int BITS>
void launch_kernel(const AffineJob& a, dim3 grid, cudaStream_t stream) {
  launch_pdl(tma_affine_kernel<BITS>, grid, dim3(kThreads), smem_bytes(BITS), stream, a);
}

}  // namespace

bool affine_tma_job(const MmaJob& j) {
  static const bool on = env_switch_on("PD_AFFINE_TMA");
  if (!on || j.parts <= 0) return false;
  const int bits = j.part[0].w.bits;
  for (int i = 0; i < j.parts; ++i) {
    const MmaPart& p = j.part[i];
    if (!affine_matrix(p.w, bits, p.grouped) ||
        (j.dual &&
         (!affine_matrix(p.w2, bits, p.grouped) || p.w2.rows != p.w.rows || p.w2.cols != p.w.cols))) {
      return false;
    }
  }
  return true;
}

int64_t affine_tma_part_bytes(int64_t rows, int64_t K) {
  PartLayout l;
  l.rows = std::max<int64_t>(rows, 1);
  l.k = K;
  l.sum_stride = round_up(l.rows, 4);
  l.fs_shift = 5;
  return l.bytes();
}

int64_t affine_tma_scratch_bytes(const MmaJob& j, int m_tiles) {
  int64_t bytes = 0;
  for (int i = 0; i < j.parts; ++i) {
    if (shared_split(j, i, m_tiles) < 0) bytes += part_layout(j, j.part[i], m_tiles).bytes();
  }
  return bytes;
}

void launch_affine_tma(const MmaJob& j, int m_tiles, void* scratch, cudaStream_t stream) {
  AffineJob a{};
  auto* at = static_cast<uint8_t*>(scratch);
  bool ok = true;
  int tiles = 0;
  for (int i = 0; i < j.parts; ++i) {
    const MmaPart& p = j.part[i];
    AffinePart& q = a.part[i];
    const PartLayout l = part_layout(j, p, m_tiles);
    const int same = shared_split(j, i, m_tiles);
    if (same >= 0) {
      q.hi = a.part[same].hi;
      q.lo = a.part[same].lo;
      q.sums = a.part[same].sums;
    } else {
      auto* hi = reinterpret_cast<uint16_t*>(at);
      uint16_t* lo = hi + l.rows * l.k;
      auto* sums = reinterpret_cast<float*>(lo + l.rows * l.k);
      at += l.bytes();
      ok = ok && encode_bf16_tile_map(&q.hi, hi, l.rows, l.k, l.k, kK, kARows) &&
           encode_bf16_tile_map(&q.lo, lo, l.rows, l.k, l.k, kK, kARows) && sum_map(&q.sums, sums, l);
      AffineSplit s{};
      s.x = p.x;
      s.xs = p.xs;
      s.k = p.w.cols;
      s.fs_shift = l.fs_shift;
      s.rows = p.rows;
      if (p.grouped) {
        s.list = j.list;
        s.list_stride = j.list_stride;
        s.count = j.count;
        s.tile_start = j.tile_start;
        s.experts = j.experts;
        s.list_div = p.list_div;
      }
      s.hi = hi;
      s.lo = lo;
      s.sums = sums;
      s.sum_stride = l.sum_stride;
      launch_pdl(split_affine_kernel, dim3(static_cast<unsigned>(l.rows)), dim3(128), 0, stream, s);
    }
    const int experts = p.grouped ? j.experts : 1;
    ok = ok && code_map(&q.w, p.w, experts) && (!j.dual || code_map(&q.w2, p.w2, experts));
    q.sw = scales_of(p.w, p.grouped);
    q.sw2 = j.dual ? scales_of(p.w2, p.grouped) : q.sw;
    q.out = p.out;
    q.os = p.os;
    q.n = p.w.rows;
    q.k = p.w.cols;
    q.rows = p.rows;
    q.k_tiles = static_cast<int>((p.w.cols + kK - 1) / kK);
    q.fs_shift = l.fs_shift;
    q.grouped = p.grouped;
    const int per_tile = j.dual ? kWRows / 2 : kWRows;
    tiles += static_cast<int>((p.w.rows + per_tile - 1) / per_tile);
    a.n_tiles_end[i] = tiles;
  }
  if (!ok) tensor_map_failed();  // affine_tma_job vouched for the shapes
  a.list = j.list;
  a.list_stride = j.list_stride;
  a.count = j.count;
  a.tile_start = j.tile_start;
  a.experts = j.experts;
  a.parts = j.parts;
  a.dual = j.dual;
  a.accumulate = j.accumulate;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(m_tiles));
  switch (j.part[0].w.bits) {
    case 2:
      launch_kernel<2>(a, grid, stream);
      break;
    case 4:
      launch_kernel<4>(a, grid, stream);
      break;
    case 6:
      launch_kernel<6>(a, grid, stream);
      break;
    default:
      launch_kernel<8>(a, grid, stream);
      break;
  }
}

bool opt_in_affine_tma() {
  const auto opt_in = [](auto kernel, int bits) {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(smem_bytes(bits))) == cudaSuccess;
  };
  return opt_in(tma_affine_kernel<2>, 2) && opt_in(tma_affine_kernel<4>, 4) &&
         opt_in(tma_affine_kernel<6>, 6) && opt_in(tma_affine_kernel<8>, 8);
}

}  // namespace pd::cuda
