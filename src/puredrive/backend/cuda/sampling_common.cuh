// Device side of the sample op (sampling.h): the scratch layout, per-row and per-call state, the penalised
// logit and weight of one token, the selection key, and block-wide helpers over exact 128-bit sums.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "puredrive/backend/cuda/sampling.h"
#include "puredrive/backend/cuda/scratch_carver.h"
#include "puredrive/backend/sampling_math.h"

// Kernel launches go through this macro so that a test can run the kernels on the CPU
// (tests/cuda/sampling_emulated_test.cpp), which has no GPU to check them on otherwise.
#ifndef PD_SAMPLE_LAUNCH
#define PD_SAMPLE_LAUNCH(kernel, grid, block, stream, ...) \
  kernel<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__)
#endif

namespace pd::cuda::smp {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPerThread = 8;
constexpr int kChunk = kThreads * kPerThread;  // tokens per block
constexpr int kBins = 2048;                    // 11-bit radix digits
constexpr int kDigits = 8;
constexpr int kFirstIdDigit = 6;
// Candidates one block sorts, and grid-wide selection passes before one block per row finishes. The emulated
// test also builds the kernels with tiny values, so that every path of the selection runs on small rows.
#ifndef PD_SAMPLE_GATHER_CAP
#define PD_SAMPLE_GATHER_CAP 2048
#endif
#ifndef PD_SAMPLE_SELECT_PASSES
#define PD_SAMPLE_SELECT_PASSES 4
#endif
constexpr int kCap = PD_SAMPLE_GATHER_CAP;
constexpr int kSelectPasses = PD_SAMPLE_SELECT_PASSES;
// Rows of at most this many blocks (16K tokens) skip the grid-wide passes.
#ifndef PD_SAMPLE_SELECT_ALONE_BLOCKS
#define PD_SAMPLE_SELECT_ALONE_BLOCKS 8
#endif
constexpr int kSelectAloneBlocks = PD_SAMPLE_SELECT_ALONE_BLOCKS;

// kw = bits(w) - bits(2^-106) < 2^59 for every kept weight w in [2^-106, 1]: the selection key is
// (kw desc, id asc), stored as (kw, kIdMax - id) so that larger keys come first.
constexpr uint64_t kWBase = uint64_t{917} << 52;
constexpr uint64_t kKwMask = (uint64_t{1} << 59) - 1;
constexpr uint32_t kIdMax = (1u << 20) - 1;
constexpr unsigned int kNoError = 0xffffffffu;
constexpr unsigned int kSlotAllMasked = 1u << 20;  // row error slots after the tokens
constexpr unsigned int kSlotPenalisedInf = (1u << 20) + 1;

struct RowState {
  unsigned long long argmax_key;        // ordered penalised logit << 32 | ~id: the lowest id of the maximum
  unsigned long long raw_max_key;       // the same over the raw logits (logprobs)
  unsigned int kept;                    // tokens with w > 0 after min_p
  unsigned int done_blocks;             // blocks of the current kernel that finished (last-block pattern)
  unsigned long long mass_lo, mass_hi;  // their fixed-point mass
  // Selection: phase 1 finds the top_k-th token, phase 2 the last token of the top_p nucleus.
  int phase;   // 0: resolved
  int digit;   // the digit the next histogram pass looks at
  int gather;  // next pass: 0 histogram, 1 gather every key >= the bin's lower bound, 2 gather the bin
  int has_cut;
  unsigned long long pre_kw, mask_kw;  // digits fixed so far
  unsigned int pre_id, mask_id;
  int has_lo;  // phase 2 after phase 1: only keys >= lo (the top-k set)
  unsigned int lo_id;
  unsigned long long lo_kw;
  unsigned int above_count;  // in-range tokens ranked before the current prefix
  unsigned int target_rank;  // phase 1: top_k
  unsigned long long above_lo, above_hi;
  double thr;                         // phase 2: top_p * double(mass of the set)
  unsigned long long min_kw, max_kw;  // over the tokens in range of the last histogram pass
  unsigned long long cut_kw;          // the last kept key
  unsigned int cut_id;
  unsigned int ncand;
  unsigned long long final_lo, final_hi;  // M': the mass of the kept tokens
  double W;                               // double(M') 2^-106
  int seeded_token;
  int top_ids[20];
  unsigned long long lse_lo, lse_hi;
  double log_z;
  unsigned int hist_count[kBins];
  unsigned long long hist_lo[kBins], hist_hi[kBins];
  unsigned long long cand_kw[kCap];
  unsigned int cand_id[kCap];
};

// How the final token is found: known (next), drawn from row draw_row, or drawn from its residual against
// row draw_qrow.
enum class DrawMode : int { kKnown, kRow, kResidual };

struct CallState {
  int status, d1, d2;      // a bad draft or a draft that q cannot produce
  unsigned int row_error;  // min of row << 22 | slot
  int accepted, next;
  DrawMode draw_mode;
  int draw_row, draw_qrow;
  unsigned int done_blocks;
  double draw_scale;
  double big_p[16];
  unsigned long long z_lo[16], z_hi[16];
};

struct SeedPart {
  double score;
  int token;
};

struct Layout {
  CallState* call;
  RowState* rows;
  double* w;             // [rows + draft_rows][vocab]
  SeedPart* seed_parts;  // [rows][nb]
  U128* draw_parts;      // [nb][2]
  uint64_t* top_cands;   // [rows][nb][max(logprobs, 1)]
  int nb;
};

__host__ __device__ inline int blocks_for(int vocab) {
  return (vocab + kChunk - 1) / kChunk;
}

// The parts of the scratch at base (null: none, *bytes only: the size).
__host__ __device__ inline Layout layout_of(void* base, int rows, int draft_rows, int vocab, int logprobs,
                                            int64_t* bytes = nullptr) {
  const int nb = blocks_for(vocab);
  const int nrows = rows + draft_rows;
  ScratchCarver c(base);
  Layout l{};
  l.nb = nb;
  l.call = c.take<CallState>(1);
  l.rows = c.take<RowState>(nrows);
  l.w = c.take<double>(int64_t{nrows} * vocab);
  l.seed_parts = c.take<SeedPart>(int64_t{rows} * nb);
  l.draw_parts = c.take<U128>(int64_t{2} * nb);
  l.top_cands = c.take<uint64_t>(int64_t{rows} * nb * (logprobs > 0 ? logprobs : 1));
  if (bytes != nullptr) *bytes = c.bytes();
  return l;
}

// ---- One processed row: target rows 0..rows-1, then draft rows (q_{i+1} at rows + i). ----

struct RowView {
  const float* logits;
  SampleRowParams p;
  int extras;  // drafts[0 .. extras) count in the penalties
  bool penalise;
  bool greedy;
};

__device__ inline RowView row_view(const SampleLaunch& s, int r) {
  RowView v;
  const bool target = r < s.rows;
  v.logits = target ? s.logits + s.logits_stride * r : s.draft_logits + s.draft_stride * (r - s.rows);
  v.p = target ? s.target : s.draft;
  v.extras = target ? s.prior + r : r - s.rows;
  v.penalise = v.p.presence != 0.0f || v.p.frequency != 0.0f || v.p.repetition != 1.0f;
  v.greedy = v.p.temperature == 0.0f;
  return v;
}

// Logit bias, then the penalties of the history plus the extra drafts (backend/cpu/sampling.h steps 1).
__device__ inline float row_logit(const SampleLaunch& s, const RowView& v, const int* drafts, float raw,
                                  int t) {
  float z = raw;
  if (s.bias != nullptr) {
    const float b = s.bias[t];
    if (b != 0.0f) z += b;
  }
  if (v.penalise) {
    const int h = s.history[t];
    int count = h & ((1 << 30) - 1);
    const bool prompt = (h & (1 << 30)) != 0;
    for (int e = 0; e < v.extras; ++e) count += drafts[e] == t ? 1 : 0;
    z = penalised_logit(z, prompt || count > 0, count, v.p.repetition, v.p.frequency, v.p.presence);
  }
  return z;
}

// Order-preserving bits of a float with both zeros as +0 (the reference compares values, not bits).
__device__ inline uint32_t ordered_bits(float z) {
  const uint32_t b = float_bits(z == 0.0f ? 0.0f : z);
  return (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
}
__device__ inline float from_ordered(uint32_t o) {
  return float_from_bits((o & 0x80000000u) != 0 ? (o & 0x7fffffffu) : ~o);
}
// Larger key: larger value, then lower id.
__device__ inline unsigned long long value_key(float z, int t) {
  return (static_cast<unsigned long long>(ordered_bits(z)) << 32) | (0xffffffffu - static_cast<uint32_t>(t));
}
__device__ inline float key_value(unsigned long long k) {
  return from_ordered(static_cast<uint32_t>(k >> 32));
}
__device__ inline int key_token(unsigned long long k) {
  return static_cast<int>(0xffffffffu - static_cast<uint32_t>(k & 0xffffffffu));
}

// ---- The selection key ----

__device__ inline uint64_t kw_of(double w) {
  return double_bits(w) - kWBase;
}
__device__ inline double weight_of_kw(uint64_t kw) {
  return double_from_bits(kw + kWBase);
}
__device__ inline bool key_less(uint64_t akw, uint32_t aid, uint64_t bkw, uint32_t bid) {
  return akw < bkw || (akw == bkw && aid < bid);
}

// Digit d of the key: fields kw[58..48], [47..37], [36..26], [25..15], [14..4], [3..0], id[19..9], [8..0].
__device__ inline void digit_field(int d, bool* on_kw, int* shift, uint32_t* mask) {
  *on_kw = d < kFirstIdDigit;
  *mask = 0x7ff;
  switch (d) {
    case 0:
      *shift = 48;
      break;
    case 1:
      *shift = 37;
      break;
    case 2:
      *shift = 26;
      break;
    case 3:
      *shift = 15;
      break;
    case 4:
      *shift = 4;
      break;
    case 5:
      *shift = 0;
      *mask = 0xf;
      break;
    case 6:
      *shift = 9;
      break;
    default:
      *shift = 0;
      *mask = 0x1ff;
      break;
  }
}
__device__ inline int digit_of(uint64_t kw, uint32_t id, int d) {
  bool on_kw;
  int shift;
  uint32_t mask;
  digit_field(d, &on_kw, &shift, &mask);
  return static_cast<int>(on_kw ? (kw >> shift) & mask : (id >> shift) & mask);
}

// Block-wide helpers: every thread of the block must call them.

struct ScanSmem {
  unsigned long long lo[kWarps], hi[kWarps];
  unsigned int count[kWarps];
  U128 total;
  unsigned int total_count;
};

__device__ inline U128 shfl_up_u128(U128 v, int delta) {
  U128 r{};
  r.lo = __shfl_up_sync(0xffffffffu, v.lo, delta);
  r.hi = __shfl_up_sync(0xffffffffu, v.hi, delta);
  return r;
}

// Exclusive prefix over threads in thread order, of a mass and a count; the totals land in sm.
__device__ inline void block_exclusive_scan(U128 v, unsigned int c, ScanSmem& sm, U128* before,
                                            unsigned int* before_count) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  U128 inc = v;
  unsigned int inc_c = c;
  for (int d = 1; d < 32; d <<= 1) {
    const U128 o = shfl_up_u128(inc, d);
    const unsigned int oc = __shfl_up_sync(0xffffffffu, inc_c, d);
    if (lane >= d) {
      inc = add(inc, o);
      inc_c += oc;
    }
  }
  if (lane == 31) {
    sm.lo[warp] = inc.lo;
    sm.hi[warp] = inc.hi;
    sm.count[warp] = inc_c;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    U128 run{};
    unsigned int run_c = 0;
    for (int w = 0; w < kWarps; ++w) {
      const U128 x{sm.lo[w], sm.hi[w]};
      const unsigned int xc = sm.count[w];
      sm.lo[w] = run.lo;
      sm.hi[w] = run.hi;
      sm.count[w] = run_c;
      run = add(run, x);
      run_c += xc;
    }
    sm.total = run;
    sm.total_count = run_c;
  }
  __syncthreads();
  const U128 warp_before{sm.lo[warp], sm.hi[warp]};
  *before = add(warp_before, sub(inc, v));
  *before_count = sm.count[warp] + inc_c - c;
  __syncthreads();
}

__device__ inline U128 block_sum(U128 v, ScanSmem& sm) {
  U128 before{};
  unsigned int bc;
  block_exclusive_scan(v, 0, sm, &before, &bc);
  return sm.total;
}

__device__ inline uint64_t ldcg_u64(const uint64_t* p) {
  return __ldcg(reinterpret_cast<const unsigned long long*>(p));
}
__device__ inline U128 ldcg_u128(const U128* p) {
  return U128{ldcg_u64(&p->lo), ldcg_u64(&p->hi)};
}

__device__ inline void atomic_add_u128(unsigned long long* lo, unsigned long long* hi, U128 v) {
  if (is_zero(v)) return;
  const unsigned long long old = atomicAdd(lo, static_cast<unsigned long long>(v.lo));
  const unsigned long long carry = old + v.lo < old ? 1ull : 0ull;
  if (v.hi + carry != 0) atomicAdd(hi, static_cast<unsigned long long>(v.hi + carry));
}

template <typename T>
__device__ inline T block_max(T v, T* sm) {  // sm: kWarps entries
  for (int d = 16; d > 0; d >>= 1) {
    const T o = __shfl_xor_sync(0xffffffffu, v, d);
    v = o > v ? o : v;
  }
  if ((threadIdx.x & 31) == 0) sm[threadIdx.x >> 5] = v;
  __syncthreads();
  T r = sm[0];
  for (int w = 1; w < kWarps; ++w) r = sm[w] > r ? sm[w] : r;
  __syncthreads();
  return r;
}

template <typename T>
__device__ inline T block_min(T v, T* sm) {
  for (int d = 16; d > 0; d >>= 1) {
    const T o = __shfl_xor_sync(0xffffffffu, v, d);
    v = o < v ? o : v;
  }
  if ((threadIdx.x & 31) == 0) sm[threadIdx.x >> 5] = v;
  __syncthreads();
  T r = sm[0];
  for (int w = 1; w < kWarps; ++w) r = sm[w] < r ? sm[w] : r;
  __syncthreads();
  return r;
}

// After this block's contribution to row counter `counter`: true in every thread of the last block to
// finish. The last block then sees every other block's writes (read them with __ldcg).
__device__ inline bool last_block(unsigned int* counter, unsigned int blocks, int* flag) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) *flag = atomicAdd(counter, 1u) == blocks - 1 ? 1 : 0;
  __syncthreads();
  const bool last = *flag != 0;
  if (last) {
    __threadfence();
    if (threadIdx.x == 0) *counter = 0;  // for the next kernel on this row
  }
  return last;
}

// Bitonic sort of n (a power of two, <= kCap) keys (kw, id), descending, in shared memory.
__device__ inline void sort_desc(unsigned long long* kw, unsigned int* id, int n) {
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < n; i += kThreads) {
        const int j = i ^ stride;
        if (j > i) {
          const bool descending = (i & size) == 0;
          const bool swap =
              descending ? key_less(kw[i], id[i], kw[j], id[j]) : key_less(kw[j], id[j], kw[i], id[i]);
          if (swap) {
            const unsigned long long tk = kw[i];
            kw[i] = kw[j];
            kw[j] = tk;
            const unsigned int ti = id[i];
            id[i] = id[j];
            id[j] = ti;
          }
        }
      }
      __syncthreads();
    }
  }
}

// The processed probability of token t in row r after selection (0 when masked): w / W.
__device__ inline double row_prob(const Layout& L, int vocab, int r, int t) {
  const RowState& row = L.rows[r];
  const double w = L.w[static_cast<int64_t>(r) * vocab + t];
  if (!(w > 0.0)) return 0.0;
  if (row.has_cut && key_less(kw_of(w), kIdMax - static_cast<uint32_t>(t), row.cut_kw, row.cut_id))
    return 0.0;
  return w / row.W;
}

__device__ inline bool failed(const CallState& c) {
  return c.status != 0 || c.row_error != kNoError;
}

}  // namespace pd::cuda::smp
