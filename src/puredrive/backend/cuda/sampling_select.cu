// The sample op, part 1 (sampling.h): penalised logits, argmax, weights and the top_k / top_p selection.
//
// Selection is a radix search over the key (w desc, id asc) of the row's kept tokens: per digit, a
// histogram of how many tokens and how much exact mass fall in each of 2048 bins; the bin where the
// running count reaches top_k (phase 1) or the running mass reaches top_p of the total (phase 2) narrows the
// range. Once the bin (or everything from it up) holds at most kCap tokens, they are gathered, sorted in one
// block and the cut is found exactly, the mass before each token being an exact prefix sum. The result is
// the reference's (backend/cpu/sampling.cpp apply_top_k / apply_top_p): both define the kept set by the
// same strict order and the same integer masses.
#include "puredrive/backend/cuda/sampling_common.cuh"
#include "puredrive/backend/cuda/sampling_kernels.h"

namespace pd::cuda::smp {
namespace {

struct SelectSmem {
  union {
    struct {
      unsigned int count[kBins];
      unsigned long long lo[kBins], hi[kBins];
    } hist;
    struct {
      unsigned long long kw[kCap];
      unsigned int id[kCap];
    } cand;
  };
  ScanSmem scan;
  unsigned long long red64[kWarps];
  int red32[kWarps];
  int flag;
  // The crossing bin of a histogram pass.
  int cross_bin;
  unsigned int cross_count, cross_count_before;
  U128 cross_mass, cross_mass_before;
  // The cut of a gather pass.
  int cut_index;
  U128 cut_before, cut_mass;
  int phase;
};

__device__ U128 above_mass(const RowState& row) {
  return U128{row.above_lo, row.above_hi};
}

__device__ bool in_range(const RowState& row, uint64_t kw, uint32_t id) {
  if (row.has_lo && key_less(kw, id, row.lo_kw, row.lo_id)) return false;
  return (kw & row.mask_kw) == row.pre_kw && (id & row.mask_id) == row.pre_id;
}

__device__ void clear_hist(SelectSmem& sm) {
  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    sm.hist.count[b] = 0;
    sm.hist.lo[b] = 0;
    sm.hist.hi[b] = 0;
  }
  __syncthreads();
}

__device__ void hist_add(SelectSmem& sm, int bin, double w) {
  atomicAdd(&sm.hist.count[bin], 1u);
  atomic_add_u128(&sm.hist.lo[bin], &sm.hist.hi[bin], to_fixed(w));
}

// This block's histogram into the row's, with the kw range of the tokens counted.
__device__ void flush_hist(RowState& row, SelectSmem& sm, unsigned long long min_kw,
                           unsigned long long max_kw) {
  __syncthreads();
  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    if (sm.hist.count[b] == 0) continue;
    atomicAdd(&row.hist_count[b], sm.hist.count[b]);
    atomic_add_u128(&row.hist_lo[b], &row.hist_hi[b], U128{sm.hist.lo[b], sm.hist.hi[b]});
  }
  min_kw = block_min(min_kw, sm.red64);
  max_kw = block_max(max_kw, sm.red64);
  if (threadIdx.x == 0) {
    atomicMin(&row.min_kw, min_kw);
    atomicMax(&row.max_kw, max_kw);
  }
}

__device__ void start_range(RowState& row) {
  row.digit = 0;
  row.gather = 0;
  row.pre_kw = 0;
  row.mask_kw = 0;
  row.pre_id = 0;
  row.mask_id = 0;
  row.above_count = 0;
  row.above_lo = 0;
  row.above_hi = 0;
  row.min_kw = ~0ull;
  row.max_kw = 0;
}

__device__ void finish_row(RowState& row, unsigned long long cut_kw, unsigned int cut_id, U128 mass) {
  row.phase = 0;
  row.has_cut = 1;
  row.cut_kw = cut_kw;
  row.cut_id = cut_id;
  row.final_lo = mass.lo;
  row.final_hi = mass.hi;
  row.W = to_double(mass) * kFixedUnit;
}

// Phase 1 found the top_k-th token; its mass is the top-k set's. Then top_p, if on, runs over that set.
__device__ void finish_top_k(RowState& row, const SampleRowParams& p, unsigned long long kw, unsigned int id,
                             U128 mass_k) {
  if (!(static_cast<double>(p.top_p) < 1.0) || row.target_rank <= 1) {
    finish_row(row, kw, id, mass_k);
    return;
  }
  row.phase = 2;
  row.has_lo = 1;
  row.lo_kw = kw;
  row.lo_id = id;
  row.thr = static_cast<double>(p.top_p) * to_double(mass_k);
  start_range(row);
}

// Reads the row's histogram (and clears it for the next pass), finds the bin where the phase's criterion is
// met, and narrows the range to it. One block.
__device__ void resolve_hist(RowState& row, const SampleRowParams& p, SelectSmem& sm) {
  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    sm.hist.count[b] = __ldcg(&row.hist_count[b]);
    sm.hist.lo[b] = __ldcg(&row.hist_lo[b]);
    sm.hist.hi[b] = __ldcg(&row.hist_hi[b]);
    row.hist_count[b] = 0;
    row.hist_lo[b] = 0;
    row.hist_hi[b] = 0;
  }
  if (threadIdx.x == 0) sm.cross_bin = -1;
  __syncthreads();
  // Thread t owns the bins at descending positions 8t .. 8t + 7.
  const int first = kBins - 1 - kPerThread * static_cast<int>(threadIdx.x);
  U128 seg{};
  unsigned int seg_count = 0;
  for (int j = 0; j < kPerThread; ++j) {
    seg = add(seg, U128{sm.hist.lo[first - j], sm.hist.hi[first - j]});
    seg_count += sm.hist.count[first - j];
  }
  U128 before{};
  unsigned int before_count;
  block_exclusive_scan(seg, seg_count, sm.scan, &before, &before_count);
  const int phase = __ldcg(&row.phase);
  const unsigned int need = phase == 1 ? row.target_rank - row.above_count : 0;
  const U128 above = above_mass(row);
  const double thr = row.thr;
  auto crossed = [&](unsigned int count_incl, U128 mass_incl) {
    return phase == 1 ? count_incl >= need : !(to_double(add(above, mass_incl)) < thr);
  };
  if (!crossed(before_count, before)) {
    U128 m = before;
    unsigned int c = before_count;
    for (int j = 0; j < kPerThread; ++j) {
      const int b = first - j;
      const U128 bm{sm.hist.lo[b], sm.hist.hi[b]};
      if (crossed(c + sm.hist.count[b], add(m, bm))) {
        sm.cross_bin = b;
        sm.cross_count = sm.hist.count[b];
        sm.cross_count_before = c;
        sm.cross_mass = bm;
        sm.cross_mass_before = m;
        break;
      }
      m = add(m, bm);
      c += sm.hist.count[b];
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int b = sm.cross_bin;
    if (b < 0) {  // unreachable: the range always holds the crossing; keep every token rather than fail
      row.phase = 0;
      row.has_cut = 0;
      row.final_lo = row.mass_lo;
      row.final_hi = row.mass_hi;
      row.W = to_double(U128{row.mass_lo, row.mass_hi}) * kFixedUnit;
      return;
    }
    const int d = row.digit;
    bool on_kw;
    int shift;
    uint32_t mask;
    digit_field(d, &on_kw, &shift, &mask);
    row.above_count += sm.cross_count_before;
    const U128 na = add(above, sm.cross_mass_before);
    row.above_lo = na.lo;
    row.above_hi = na.hi;
    if (on_kw) {
      row.pre_kw |= static_cast<unsigned long long>(b) << shift;
      row.mask_kw |= static_cast<unsigned long long>(mask) << shift;
    } else {
      row.pre_id |= static_cast<unsigned int>(b) << shift;
      row.mask_id |= mask << shift;
    }
    int next = d + 1;
    // Every token in range has the same weight (ties): skip to the id digits.
    if (on_kw && row.min_kw == row.max_kw) {
      row.pre_kw = row.min_kw;
      row.mask_kw = kKwMask;
      next = kFirstIdDigit;
    }
    row.min_kw = ~0ull;
    row.max_kw = 0;
    if (d == kDigits - 1) {  // the full key: one token
      const U128 mass = add(na, sm.cross_mass);
      if (phase == 1) {
        finish_top_k(row, p, row.pre_kw, row.pre_id, mass);
      } else {
        finish_row(row, row.pre_kw, row.pre_id, mass);
      }
    } else if (row.above_count + sm.cross_count <= kCap) {
      row.gather = 1;
    } else if (sm.cross_count <= kCap) {
      row.gather = 2;
    } else {
      row.digit = next;
    }
  }
  __syncthreads();
}

// Sorts the gathered candidates and finds the cut exactly. gather 1: the candidates are every in-range key
// from the current bin up, so ranks and masses start at 0; gather 2: the bin alone, after above_*.
__device__ void resolve_gather(RowState& row, const SampleRowParams& p, SelectSmem& sm) {
  const int n = static_cast<int>(min(__ldcg(&row.ncand), static_cast<unsigned int>(kCap)));
  int size = 1;
  while (size < n) size <<= 1;
  for (int i = threadIdx.x; i < size; i += kThreads) {
    sm.cand.kw[i] = i < n ? __ldcg(&row.cand_kw[i]) : 0ull;
    sm.cand.id[i] = i < n ? __ldcg(&row.cand_id[i]) : 0u;
  }
  __syncthreads();
  sort_desc(sm.cand.kw, sm.cand.id, size);
  const bool all = row.gather == 1;
  const U128 start_mass = all ? U128{} : above_mass(row);
  const unsigned int start_count = all ? 0u : row.above_count;
  // Thread t owns candidates 8t .. 8t + 7.
  const int i0 = kPerThread * static_cast<int>(threadIdx.x);
  U128 mine{};
  for (int j = 0; j < kPerThread; ++j) {
    if (i0 + j < n) mine = add(mine, to_fixed(weight_of_kw(sm.cand.kw[i0 + j])));
  }
  U128 before{};
  unsigned int unused;
  block_exclusive_scan(mine, 0, sm.scan, &before, &unused);
  before = add(before, start_mass);
  int phase = __ldcg(&row.phase);
  if (threadIdx.x == 0) sm.cut_index = -1;
  __syncthreads();
  int limit = n - 1;  // phase 2 looks at candidates 0..limit
  double thr = row.thr;
  if (phase == 1) {
    const int idx = static_cast<int>(row.target_rank - start_count) - 1;
    U128 b = before;
    for (int j = 0; j < kPerThread; ++j) {
      const int i = i0 + j;
      const U128 m = i < n ? to_fixed(weight_of_kw(sm.cand.kw[i])) : U128{};
      if (i == idx) {
        sm.cut_before = b;
        sm.cut_mass = m;
      }
      b = add(b, m);
    }
    __syncthreads();
    const U128 mass_k = add(sm.cut_before, sm.cut_mass);
    const bool top_p = static_cast<double>(p.top_p) < 1.0 && row.target_rank > 1;
    if (!top_p || !all) {
      if (threadIdx.x == 0) {
        finish_top_k(row, p, sm.cand.kw[idx], sm.cand.id[idx], mass_k);
        row.gather = 0;
        row.ncand = 0;
      }
      __syncthreads();
      return;
    }
    // Everything of the top-k set is here, sorted: top_p over it right away.
    thr = static_cast<double>(p.top_p) * to_double(mass_k);
    limit = idx;
    phase = 2;
  }
  // Phase 2: the last candidate whose mass before it stays below the threshold.
  int last = -1;
  U128 b = before;
  for (int j = 0; j < kPerThread; ++j) {
    const int i = i0 + j;
    if (i > limit) break;
    if (to_double(b) < thr) last = i;
    b = add(b, to_fixed(weight_of_kw(sm.cand.kw[i])));
  }
  last = block_max(last, sm.red32);
  b = before;
  for (int j = 0; j < kPerThread; ++j) {
    const int i = i0 + j;
    const U128 m = i < n ? to_fixed(weight_of_kw(sm.cand.kw[i])) : U128{};
    if (i == last) {
      sm.cut_before = b;
      sm.cut_mass = m;
    }
    b = add(b, m);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int c = last < 0 ? 0 : last;  // unreachable: the first candidate always stays
    finish_row(row, sm.cand.kw[c], sm.cand.id[c], add(sm.cut_before, sm.cut_mass));
    row.gather = 0;
    row.ncand = 0;
  }
  __syncthreads();
}

// One block's share of a selection pass over tokens [begin, end) of row r.
__device__ void select_chunk(const Layout& L, const SampleLaunch& s, RowState& row, int r, int begin, int end,
                             SelectSmem& sm, int gather, int digit) {
  const double* w = L.w + static_cast<int64_t>(r) * s.vocab;
  unsigned long long min_kw = ~0ull, max_kw = 0;
  for (int t = begin + static_cast<int>(threadIdx.x); t < end; t += kThreads) {
    const double wt = w[t];
    if (!(wt > 0.0)) continue;
    const uint64_t kw = kw_of(wt);
    const uint32_t id = kIdMax - static_cast<uint32_t>(t);
    if (gather == 1) {
      if (row.has_lo && key_less(kw, id, row.lo_kw, row.lo_id)) continue;
      if (key_less(kw, id, row.pre_kw, row.pre_id)) continue;
    } else if (!in_range(row, kw, id)) {
      continue;
    }
    if (gather != 0) {
      const unsigned int slot = atomicAdd(&row.ncand, 1u);
      if (slot < static_cast<unsigned int>(kCap)) {
        row.cand_kw[slot] = kw;
        row.cand_id[slot] = id;
      }
    } else {
      hist_add(sm, digit_of(kw, id, digit), wt);
      min_kw = kw < min_kw ? kw : min_kw;
      max_kw = kw > max_kw ? kw : max_kw;
    }
  }
  if (gather == 0) flush_hist(row, sm, min_kw, max_kw);
}

__device__ void resolve(RowState& row, const SampleRowParams& p, SelectSmem& sm, int gather) {
  if (gather != 0) {
    resolve_gather(row, p, sm);
  } else {
    resolve_hist(row, p, sm);
  }
}

// Row phase, read once per block so that every thread takes the same path.
__device__ int read_phase(const RowState& row, SelectSmem& sm) {
  if (threadIdx.x == 0) sm.phase = __ldcg(&row.phase);
  __syncthreads();
  const int phase = sm.phase;
  __syncthreads();
  return phase;
}

__global__ void __launch_bounds__(kThreads) k_init(SampleLaunch s, Layout L) {
  const int r = blockIdx.x;
  RowState& row = L.rows[r];
  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    row.hist_count[b] = 0;
    row.hist_lo[b] = 0;
    row.hist_hi[b] = 0;
  }
  if (threadIdx.x == 0) {
    row.argmax_key = 0;
    row.raw_max_key = 0;
    row.kept = 0;
    row.done_blocks = 0;
    row.mass_lo = 0;
    row.mass_hi = 0;
    row.phase = 0;
    row.has_cut = 0;
    row.has_lo = 0;
    row.ncand = 0;
    row.seeded_token = -1;
    row.lse_lo = 0;
    row.lse_hi = 0;
    start_range(row);
  }
  if (r == 0 && threadIdx.x == 0) {
    CallState& c = *L.call;
    c.status = 0;
    c.d1 = 0;
    c.d2 = 0;
    c.row_error = kNoError;
    c.accepted = 0;
    c.next = -1;
    c.draw_mode = DrawMode::kKnown;
    c.done_blocks = 0;
    for (int i = 0; i < 16; ++i) {
      c.z_lo[i] = 0;
      c.z_hi[i] = 0;
      c.big_p[i] = 1.0;
    }
    const int n = s.prior + s.rows - 1;
    for (int i = 0; i < n; ++i) {
      const int d = s.drafts[i];
      if (d < 0 || d >= s.vocab) {
        c.status = 4;  // kBadToken
        c.d1 = i;
        c.d2 = d;
        break;
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads) k_prep(SampleLaunch s, Layout L) {
  __shared__ int drafts[16];
  __shared__ unsigned long long red64[kWarps];
  __shared__ unsigned int red32[kWarps];
  if (L.call->status != 0) return;
  const int r = blockIdx.y;
  const RowView v = row_view(s, r);
  if (threadIdx.x < 16)
    drafts[threadIdx.x] = static_cast<int>(threadIdx.x) < v.extras ? s.drafts[threadIdx.x] : -1;
  __syncthreads();
  const bool raw_max = s.logprobs >= 0 && r < s.rows;
  unsigned long long best = 0, raw_best = 0;
  unsigned int bad = kNoError;
  const int begin = blockIdx.x * kChunk, end = min(begin + kChunk, s.vocab);
  for (int t = begin + static_cast<int>(threadIdx.x); t < end; t += kThreads) {
    const float raw = v.logits[t];
    if (isnan(raw) || raw == infinity_d()) {
      bad = min(bad, static_cast<unsigned int>(t));
      continue;
    }
    const unsigned long long k = value_key(row_logit(s, v, drafts, raw, t), t);
    best = k > best ? k : best;
    if (raw_max) {
      const unsigned long long rk = value_key(raw, t);
      raw_best = rk > raw_best ? rk : raw_best;
    }
  }
  best = block_max(best, red64);
  raw_best = block_max(raw_best, red64);
  bad = block_min(bad, red32);
  if (threadIdx.x == 0) {
    RowState& row = L.rows[r];
    atomicMax(&row.argmax_key, best);
    if (raw_max) atomicMax(&row.raw_max_key, raw_best);
    if (bad != kNoError) atomicMin(&L.call->row_error, (static_cast<unsigned int>(r) << 22) | bad);
  }
}

// Weights into scratch, their count and mass, and (select) the first histogram pass of the selection.
__global__ void __launch_bounds__(kThreads) k_weights(SampleLaunch s, Layout L, int select) {
  __shared__ SelectSmem sm;
  __shared__ int drafts[16];
  if (failed(*L.call)) return;
  const int r = blockIdx.y;
  RowState& row = L.rows[r];
  const RowView v = row_view(s, r);
  const unsigned long long key = row.argmax_key;
  const float top = key_value(key);
  const int argmax = key_token(key);
  if (top == -infinity_d() || top == infinity_d()) {
    if (threadIdx.x == 0) {
      const unsigned int slot = top == infinity_d() ? kSlotPenalisedInf : kSlotAllMasked;
      atomicMin(&L.call->row_error, (static_cast<unsigned int>(r) << 22) | slot);
    }
    return;
  }
  if (threadIdx.x < 16)
    drafts[threadIdx.x] = static_cast<int>(threadIdx.x) < v.extras ? s.drafts[threadIdx.x] : -1;
  const bool hist = select != 0 && !v.greedy;
  if (hist) clear_hist(sm);
  __syncthreads();
  const double z_max = static_cast<double>(top);  // a zero maximum is +0 here, as in the reference
  const double temperature = v.p.temperature;
  const double min_p = v.p.min_p;
  double* w = L.w + static_cast<int64_t>(r) * s.vocab;
  U128 mass{};
  unsigned int kept = 0;
  unsigned long long min_kw = ~0ull, max_kw = 0;
  const int begin = blockIdx.x * kChunk, end = min(begin + kChunk, s.vocab);
  for (int t = begin + static_cast<int>(threadIdx.x); t < end; t += kThreads) {
    double wt = 0.0;
    if (v.greedy) {
      wt = t == argmax ? 1.0 : 0.0;
    } else {
      wt = logit_weight(row_logit(s, v, drafts, v.logits[t], t), z_max, temperature);
      if (!(wt >= kMinWeight && wt >= min_p)) wt = 0.0;
    }
    w[t] = wt;
    if (wt > 0.0) {
      ++kept;
      mass = add(mass, to_fixed(wt));
      if (hist) {
        const uint64_t kw = kw_of(wt);
        hist_add(sm, digit_of(kw, kIdMax - static_cast<uint32_t>(t), 0), wt);
        min_kw = kw < min_kw ? kw : min_kw;
        max_kw = kw > max_kw ? kw : max_kw;
      }
    }
  }
  U128 before{};
  unsigned int unused;
  block_exclusive_scan(mass, kept, sm.scan, &before, &unused);
  if (threadIdx.x == 0) {
    atomic_add_u128(&row.mass_lo, &row.mass_hi, sm.scan.total);
    atomicAdd(&row.kept, sm.scan.total_count);
  }
  if (hist) flush_hist(row, sm, min_kw, max_kw);
  if (!last_block(&row.done_blocks, gridDim.x, &sm.flag)) return;
  if (threadIdx.x == 0) {
    const unsigned int n = __ldcg(&row.kept);
    const U128 total{__ldcg(&row.mass_lo), __ldcg(&row.mass_hi)};
    row.phase = 0;
    if (!v.greedy && v.p.top_k > 0 && n > static_cast<unsigned int>(v.p.top_k)) {
      row.phase = 1;
      row.target_rank = static_cast<unsigned int>(v.p.top_k);
    } else if (!v.greedy && static_cast<double>(v.p.top_p) < 1.0 && n > 1) {
      row.phase = 2;
      row.thr = static_cast<double>(v.p.top_p) * to_double(total);
    }
    if (row.phase == 0) {
      row.has_cut = 0;
      row.final_lo = total.lo;
      row.final_hi = total.hi;
      row.W = to_double(total) * kFixedUnit;
    }
    sm.phase = row.phase;
  }
  __syncthreads();
  if (sm.phase != 0) resolve_hist(row, v.p, sm);  // select is on whenever a phase can start
}

// One grid-wide pass of the selection for every row still searching.
__global__ void __launch_bounds__(kThreads) k_select(SampleLaunch s, Layout L) {
  __shared__ SelectSmem sm;
  if (failed(*L.call)) return;
  const int r = blockIdx.y;
  RowState& row = L.rows[r];
  if (read_phase(row, sm) == 0) return;
  const int gather = row.gather, digit = row.digit;
  if (gather == 0) clear_hist(sm);
  const int begin = blockIdx.x * kChunk, end = min(begin + kChunk, s.vocab);
  select_chunk(L, s, row, r, begin, end, sm, gather, digit);
  if (!last_block(&row.done_blocks, gridDim.x, &sm.flag)) return;
  resolve(row, row_view(s, r).p, sm, gather);
}

// One block per row finishes what the grid-wide passes left, pass after pass over the whole row.
__global__ void __launch_bounds__(kThreads) k_select_finish(SampleLaunch s, Layout L) {
  __shared__ SelectSmem sm;
  if (failed(*L.call)) return;
  const int r = blockIdx.x;
  RowState& row = L.rows[r];
  const SampleRowParams p = row_view(s, r).p;
  for (int pass = 0; pass < 4 * kDigits; ++pass) {
    if (read_phase(row, sm) == 0) return;
    const int gather = row.gather, digit = row.digit;
    if (gather == 0) clear_hist(sm);
    select_chunk(L, s, row, r, 0, s.vocab, sm, gather, digit);
    __threadfence();
    __syncthreads();
    resolve(row, p, sm, gather);
  }
}

}  // namespace

void launch_rows(const SampleLaunch& s, const Layout& L, bool weights, bool select, cudaStream_t stream) {
  const int nrows = s.rows + s.draft_rows;
  const dim3 grid(static_cast<unsigned int>(L.nb), static_cast<unsigned int>(nrows));
  PD_SAMPLE_LAUNCH(k_init, nrows, kThreads, stream, s, L);
  PD_SAMPLE_LAUNCH(k_prep, grid, kThreads, stream, s, L);
  if (!weights) return;
  PD_SAMPLE_LAUNCH(k_weights, grid, kThreads, stream, s, L, select ? 1 : 0);
  if (!select) return;
  // On a small vocabulary the one-block finisher's passes cost less than grid-wide launches.
  if (L.nb > kSelectAloneBlocks) {
    for (int pass = 0; pass < kSelectPasses; ++pass) PD_SAMPLE_LAUNCH(k_select, grid, kThreads, stream, s, L);
  }
  PD_SAMPLE_LAUNCH(k_select_finish, nrows, kThreads, stream, s, L);
}

}  // namespace pd::cuda::smp
