// The sample op, part 2 (sampling.h): the acceptance rules on the processed rows, the final draw, logprobs
// and the output words. The rules are backend/cpu/sampling.cpp accept(): scalar decisions are taken by one
// thread in the reference's order, with the reference's expressions; sums over the vocabulary are exact.
#include "puredrive/backend/cuda/sampling_kernels.h"

namespace pd::cuda::smp {
namespace {

constexpr int kStatusNonFinite = 1, kStatusAllMasked = 2, kStatusDraftNotInDraft = 3;
constexpr int kOutAccepted = 3, kOutTokens = 4;
constexpr int kControlSeed = 0, kControlPosition = 1, kControlUniforms = 2;
constexpr double kUncappedLimit = 0x1.0p+20;

__device__ double uniform(const SampleLaunch& s, int i) {
  return double_from_bits(static_cast<uint64_t>(s.control[kControlUniforms + i]));
}

// (score desc, token asc); token -1: none.
__device__ bool better(double a, int at, double b, int bt) {
  return at >= 0 && (bt < 0 || a > b || (a == b && at < bt));
}

// The seeded draw of every target row: argmax over kept tokens of log p + gumbel(seed, position + j, t).
__global__ void __launch_bounds__(kThreads) k_seeded(SampleLaunch s, Layout L) {
  __shared__ double ws[kWarps];
  __shared__ int wt[kWarps];
  __shared__ int flag;
  if (failed(*L.call)) return;
  const int j = blockIdx.y;
  const uint64_t seed = static_cast<uint64_t>(s.control[kControlSeed]);
  const int64_t position = s.control[kControlPosition] + j;
  double best = 0.0;
  int best_t = -1;
  const int begin = blockIdx.x * kChunk, end = min(begin + kChunk, s.vocab);
  for (int t = begin + static_cast<int>(threadIdx.x); t < end; t += kThreads) {
    const double p = row_prob(L, s.vocab, j, t);
    if (!(p > 0.0)) continue;
    const double score = det_log(p) + gumbel_noise(seed, position, t);
    if (better(score, t, best, best_t)) {
      best = score;
      best_t = t;
    }
  }
  for (int d = 16; d > 0; d >>= 1) {
    const double os = __shfl_xor_sync(0xffffffffu, best, d);
    const int ot = __shfl_xor_sync(0xffffffffu, best_t, d);
    if (better(os, ot, best, best_t)) {
      best = os;
      best_t = ot;
    }
  }
  if ((threadIdx.x & 31) == 0) {
    ws[threadIdx.x >> 5] = best;
    wt[threadIdx.x >> 5] = best_t;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWarps; ++w) {
      if (better(ws[w], wt[w], ws[0], wt[0])) {
        ws[0] = ws[w];
        wt[0] = wt[w];
      }
    }
    L.seed_parts[j * L.nb + static_cast<int>(blockIdx.x)] = SeedPart{ws[0], wt[0]};
  }
  RowState& row = L.rows[j];
  if (!last_block(&row.done_blocks, gridDim.x, &flag)) return;
  if (threadIdx.x == 0) {
    double b = 0.0;
    int bt = -1;
    for (int i = 0; i < L.nb; ++i) {
      const SeedPart* part = &L.seed_parts[j * L.nb + i];
      const double ps = __ldcg(&part->score);
      const int pt = __ldcg(&part->token);
      if (better(ps, pt, b, bt)) {
        b = ps;
        bt = pt;
      }
    }
    row.seeded_token = bt;
  }
}

// Block verification's running ratios P_1..P_k (docs/spec/speculative.md §2), in order; q(d) = 0 fails.
__global__ void k_accept_prep(SampleLaunch s, Layout L) {
  CallState& c = *L.call;
  if (threadIdx.x != 0 || failed(c)) return;
  const int k = s.rows - 1;
  const double cap = s.faulty == Faulty::kBlockUncapped ? kUncappedLimit : 1.0;
  c.big_p[0] = 1.0;
  for (int i = 1; i <= k; ++i) {
    const int d = s.drafts[s.prior + i - 1];
    const double qd = row_prob(L, s.vocab, s.rows + i - 1, d);
    if (!(qd > 0.0)) {
      c.status = kStatusDraftNotInDraft;
      c.d1 = i - 1;
      return;
    }
    const double ratio = row_prob(L, s.vocab, i - 1, d) / qd;
    const double prod = c.big_p[i - 1] * ratio;
    c.big_p[i] = prod < cap ? prod : cap;
  }
}

// Z_i = sum_x max(0, P_i p_i(x) - q_{i+1}(x)) for i = 1..k-1, exactly.
__global__ void __launch_bounds__(kThreads) k_residual_mass(SampleLaunch s, Layout L) {
  __shared__ ScanSmem sm;
  CallState& c = *L.call;
  if (failed(c)) return;
  const int i = static_cast<int>(blockIdx.y) + 1;
  const double scale = c.big_p[i];
  U128 sum{};
  const int begin = blockIdx.x * kChunk, end = min(begin + kChunk, s.vocab);
  for (int t = begin + static_cast<int>(threadIdx.x); t < end; t += kThreads) {
    const double p = row_prob(L, s.vocab, i, t);
    if (!(p > 0.0)) continue;
    const double r = scale * p - row_prob(L, s.vocab, s.rows + i, t);
    if (r > 0.0) sum = add(sum, to_fixed(r));
  }
  sum = block_sum(sum, sm);
  if (threadIdx.x == 0) atomic_add_u128(&c.z_lo[i], &c.z_hi[i], sum);
}

__device__ void set_draw(CallState& c, int accepted, DrawMode mode, int row, int qrow, double scale) {
  c.accepted = accepted;
  c.draw_mode = mode;
  c.draw_row = row;
  c.draw_qrow = qrow;
  c.draw_scale = scale;
}

// The rule's decision (one thread): a, and y or how to draw it.
__device__ void decide(const SampleLaunch& s, const Layout& L) {
  CallState& c = *L.call;
  if (c.status != 0) return;
  const int nrows = s.rows + s.draft_rows;
  unsigned int err = c.row_error;
  for (int r = 0; r < nrows; ++r) {  // rows whose maximum is -inf or +inf (no weights kernel on greedy calls)
    const float top = key_value(L.rows[r].argmax_key);
    const unsigned int row_bits = static_cast<unsigned int>(r) << 22;
    if (top == -infinity_d()) err = min(err, row_bits | kSlotAllMasked);
    if (top == infinity_d()) err = min(err, row_bits | kSlotPenalisedInf);
  }
  c.row_error = err;
  if (err != kNoError) return;
  const int k = s.rows - 1;
  const int* d = s.drafts + s.prior;
  switch (s.rule) {
    case SampleRule::kGreedy:
    case SampleRule::kSeeded: {
      int j = 0;
      int own = 0;
      for (; j <= k; ++j) {
        own = s.rule == SampleRule::kGreedy ? key_token(L.rows[j].argmax_key) : L.rows[j].seeded_token;
        if (j == k || d[j] != own) break;
      }
      c.accepted = j;
      c.next = own;
      c.draw_mode = DrawMode::kKnown;
      return;
    }
    case SampleRule::kTokenwise:
      for (int j = 0; j < k; ++j) {
        const double pd = row_prob(L, s.vocab, j, d[j]);
        const double qd = row_prob(L, s.vocab, s.rows + j, d[j]);
        if (!(qd > 0.0)) {
          c.status = kStatusDraftNotInDraft;
          c.d1 = j;
          return;
        }
        const double ratio = pd / qd;
        if (uniform(s, j) <= (ratio < 1.0 ? ratio : 1.0)) continue;
        if (s.faulty == Faulty::kTokenwiseResample) {
          set_draw(c, j, DrawMode::kRow, j, 0, 1.0);
        } else {
          set_draw(c, j, DrawMode::kResidual, j, s.rows + j, 1.0);
        }
        return;
      }
      set_draw(c, k, DrawMode::kRow, k, 0, 1.0);
      return;
    case SampleRule::kBlockwise: {
      int tau = 0;
      bool fail = false;
      for (int i = 1; i <= k; ++i) {
        double h = c.big_p[i];
        if (i < k) {
          const double z = to_double(U128{c.z_lo[i], c.z_hi[i]}) * kFixedUnit;
          const double denom = z + 1.0 - c.big_p[i];
          h = denom > 0.0 ? z / denom : 0.0;
        }
        const double eta = uniform(s, i - 1);
        if (s.faulty == Faulty::kBlockFirstFailure) {
          if (!fail && eta <= h) {
            tau = i;
          } else {
            fail = true;
          }
        } else if (eta <= h) {
          tau = i;
        }
      }
      if (tau == k) {
        set_draw(c, k, DrawMode::kRow, k, 0, 1.0);
      } else {
        set_draw(c, tau, DrawMode::kResidual, tau, s.rows + tau, c.big_p[tau]);
      }
      return;
    }
    default:
      return;
  }
}

__global__ void k_decide(SampleLaunch s, Layout L) {
  if (threadIdx.x == 0) decide(s, L);
}

// The mass token t carries in the final draw: row r's, or its residual against row qr.
__device__ U128 draw_mass(const Layout& L, int vocab, int r, int qr, double scale, bool residual, int t) {
  const double p = row_prob(L, vocab, r, t);
  if (!(p > 0.0)) return U128{};
  if (!residual) return to_fixed(L.w[static_cast<int64_t>(r) * vocab + t]);
  const double x = scale * p - row_prob(L, vocab, qr, t);
  return to_fixed(x > 0.0 ? x : 0.0);
}

// The inverse-CDF draw over the vocabulary in ascending id order, in integers: per-block masses, then the
// last block finds the block and the token where the running mass passes floor(total u).
__global__ void __launch_bounds__(kThreads) k_draw(SampleLaunch s, Layout L) {
  __shared__ ScanSmem sm;
  __shared__ int flag, chosen;
  __shared__ U128 target;
  __shared__ bool use_residual;
  CallState& c = *L.call;
  if (failed(c) || c.draw_mode == DrawMode::kKnown) return;
  const int r = c.draw_row, qr = c.draw_qrow;
  const double scale = c.draw_scale;
  const bool residual = c.draw_mode == DrawMode::kResidual;
  U128 mp{}, mr{};
  const int begin = blockIdx.x * kChunk, end = min(begin + kChunk, s.vocab);
  for (int t = begin + static_cast<int>(threadIdx.x); t < end; t += kThreads) {
    mp = add(mp, draw_mass(L, s.vocab, r, qr, scale, false, t));
    if (residual) mr = add(mr, draw_mass(L, s.vocab, r, qr, scale, true, t));
  }
  mp = block_sum(mp, sm);
  mr = block_sum(mr, sm);
  if (threadIdx.x == 0) {
    L.draw_parts[2 * blockIdx.x] = mp;
    L.draw_parts[2 * blockIdx.x + 1] = mr;
  }
  if (!last_block(&c.done_blocks, gridDim.x, &flag)) return;
  if (threadIdx.x == 0) {
    U128 total_p{}, total_r{};
    for (int b = 0; b < L.nb; ++b) {
      total_p = add(total_p, ldcg_u128(&L.draw_parts[2 * b]));
      total_r = add(total_r, ldcg_u128(&L.draw_parts[2 * b + 1]));
    }
    // An empty residual is reachable only through rounding; then y ~ p (the reference's fallback).
    use_residual = residual && !is_zero(total_r);
    const U128 total = use_residual ? total_r : total_p;
    const U128 x = mul_frac(total, unit_fraction(uniform(s, s.rows - 1)));
    U128 cum{};
    chosen = L.nb - 1;
    for (int b = 0; b < L.nb; ++b) {
      const int o = use_residual ? 1 : 0;
      const U128 part = ldcg_u128(&L.draw_parts[2 * b + o]);
      if (less(x, add(cum, part))) {
        chosen = b;
        break;
      }
      cum = add(cum, part);
    }
    target = sub(x, cum);
    c.next = -1;
  }
  __syncthreads();
  // The chosen block's tokens, 8 consecutive ones per thread, scanned in id order.
  const int t0 = chosen * kChunk + kPerThread * static_cast<int>(threadIdx.x);
  U128 mine{};
  for (int j = 0; j < kPerThread; ++j) {
    if (t0 + j < s.vocab) mine = add(mine, draw_mass(L, s.vocab, r, qr, scale, use_residual, t0 + j));
  }
  U128 cum{};
  unsigned int unused;
  block_exclusive_scan(mine, 0, sm, &cum, &unused);
  const U128 x = target;
  if (!less(x, cum) && less(x, add(cum, mine))) {
    for (int j = 0; j < kPerThread && t0 + j < s.vocab; ++j) {
      const U128 m = draw_mass(L, s.vocab, r, qr, scale, use_residual, t0 + j);
      if (is_zero(m)) continue;
      cum = add(cum, m);
      if (less(x, cum)) {
        c.next = t0 + j;
        break;
      }
    }
  }
}

__device__ void sort_desc_u64(unsigned long long* k, int n) {
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < n; i += kThreads) {
        const int j = i ^ stride;
        if (j > i) {
          const bool descending = (i & size) == 0;
          if (descending ? k[i] < k[j] : k[j] < k[i]) {
            const unsigned long long t = k[i];
            k[i] = k[j];
            k[j] = t;
          }
        }
      }
      __syncthreads();
    }
  }
}

// log_softmax of the raw target rows: log sum exp (exact sum) and the top n ids, (logit desc, id asc).
__global__ void __launch_bounds__(kThreads) k_logprobs(SampleLaunch s, Layout L) {
  __shared__ unsigned long long keys[kChunk];
  __shared__ unsigned long long red[kWarps];
  __shared__ ScanSmem sm;
  __shared__ int flag;
  if (failed(*L.call)) return;
  const int j = blockIdx.y;
  const int n = s.logprobs;
  RowState& row = L.rows[j];
  const float* logits = s.logits + s.logits_stride * j;
  const float top = key_value(row.raw_max_key);
  const double z_max = static_cast<double>(top);
  const bool finite = top != -infinity_d();
  U128 sum{};
  const int begin = blockIdx.x * kChunk;
  for (int i = threadIdx.x; i < kChunk; i += kThreads) {
    const int t = begin + i;
    keys[i] = 0;
    if (t >= s.vocab) continue;
    const float z = logits[t];
    keys[i] = value_key(z, t);
    if (finite) sum = add(sum, to_fixed(det_exp(static_cast<double>(z) - z_max)));
  }
  sum = block_sum(sum, sm);
  if (threadIdx.x == 0) atomic_add_u128(&row.lse_lo, &row.lse_hi, sum);
  if (n > 0) {
    sort_desc_u64(keys, kChunk);
    uint64_t* cands = L.top_cands + (static_cast<int64_t>(j) * L.nb + blockIdx.x) * n;
    for (int i = threadIdx.x; i < n; i += kThreads) cands[i] = keys[i];
  }
  if (!last_block(&row.done_blocks, gridDim.x, &flag)) return;
  if (threadIdx.x == 0) {
    row.log_z = finite
                    ? z_max + det_log(to_double(U128{__ldcg(&row.lse_lo), __ldcg(&row.lse_hi)}) * kFixedUnit)
                    : -infinity_d();
  }
  // n rounds of "the largest candidate below the previous one": keys are distinct, pads are 0.
  const uint64_t* cands = L.top_cands + static_cast<int64_t>(j) * L.nb * (n > 0 ? n : 1);
  const int total = L.nb * n;
  unsigned long long prev = ~0ull;
  for (int i = 0; i < n; ++i) {
    unsigned long long best = 0;
    for (int c = threadIdx.x; c < total; c += kThreads) {
      const unsigned long long k = ldcg_u64(cands + c);
      if (k < prev && k > best) best = k;
    }
    best = block_max(best, red);
    if (threadIdx.x == 0) row.top_ids[i] = best == 0 ? -1 : key_token(best);
    prev = best;
  }
}

__device__ int32_t logprob_bits(const float* logits, double log_z, int t) {
  return static_cast<int32_t>(float_bits(static_cast<float>(static_cast<double>(logits[t]) - log_z)));
}

// The output words (backend.h), the draft written for the verify step, and the history commit.
__device__ void finish(const SampleLaunch& s, const Layout& L) {
  const int n = s.logprobs;
  const int words = kOutTokens + s.rows + (n >= 0 ? s.rows * (1 + 2 * n) : 0);
  for (int i = threadIdx.x; i < words; i += kThreads) s.out[i] = -1;
  __syncthreads();
  if (threadIdx.x != 0) return;
  const CallState& c = *L.call;
  s.out[0] = 0;
  s.out[1] = 0;
  s.out[2] = 0;
  s.out[kOutAccepted] = 0;
  if (c.status != 0) {
    s.out[0] = c.status;
    s.out[1] = c.d1;
    s.out[2] = c.d2;
    return;
  }
  if (c.row_error != kNoError) {
    const int r = static_cast<int>(c.row_error >> 22);
    const unsigned int slot = c.row_error & ((1u << 22) - 1);
    s.out[1] = r;
    if (slot == kSlotAllMasked) {
      s.out[0] = kStatusAllMasked;
      s.out[2] = -1;
    } else {
      s.out[0] = kStatusNonFinite;
      s.out[2] = slot == kSlotPenalisedInf ? key_token(L.rows[r].argmax_key) : static_cast<int>(slot);
    }
    return;
  }
  const int a = c.accepted;
  s.out[kOutAccepted] = a;
  int32_t* tokens = s.out + kOutTokens;
  for (int j = 0; j < a; ++j) tokens[j] = s.drafts[s.prior + j];
  tokens[a] = c.next;
  if (s.write_draft) s.drafts[s.prior] = c.next;
  if (s.commit) {
    for (int j = 0; j <= a; ++j) ++s.history[tokens[j]];
  }
  if (n < 0) return;
  int32_t* lp = tokens + s.rows;
  for (int j = 0; j <= a; ++j) {
    const float* logits = s.logits + s.logits_stride * j;
    const double log_z = L.rows[j].log_z;
    int32_t* w = lp + j * (1 + 2 * n);
    w[0] = logprob_bits(logits, log_z, tokens[j]);
    for (int i = 0; i < n && L.rows[j].top_ids[i] >= 0; ++i) {
      w[1 + 2 * i] = L.rows[j].top_ids[i];
      w[2 + 2 * i] = logprob_bits(logits, log_z, L.rows[j].top_ids[i]);
    }
  }
}

__global__ void __launch_bounds__(kThreads) k_finish(SampleLaunch s, Layout L) {
  finish(s, L);
}

// Greedy and seeded calls without logprobs need nothing between the decision and the output words: one
// launch for both (a launch is worth more than the one thread's work here).
__global__ void __launch_bounds__(kThreads) k_decide_finish(SampleLaunch s, Layout L) {
  if (threadIdx.x == 0) decide(s, L);
  __syncthreads();
  finish(s, L);
}

bool can_select(const SampleRowParams& p) {
  return p.temperature != 0.0f && (p.top_k > 0 || p.top_p < 1.0f);
}

}  // namespace

void launch_sample_impl(const SampleLaunch& s, cudaStream_t stream) {
  const Layout L = layout_of(s.scratch, s.rows, s.draft_rows, s.vocab, s.logprobs);
  const bool weights = s.rule != SampleRule::kGreedy;
  const bool select = weights && (can_select(s.target) || (s.draft_rows > 0 && can_select(s.draft)));
  launch_rows(s, L, weights, select, stream);
  const int k = s.rows - 1;
  const unsigned int nb = static_cast<unsigned int>(L.nb);
  if (s.rule == SampleRule::kSeeded)
    PD_SAMPLE_LAUNCH(k_seeded, dim3(nb, static_cast<unsigned int>(s.rows)), kThreads, stream, s, L);
  if (s.rule == SampleRule::kBlockwise && k >= 1) {
    PD_SAMPLE_LAUNCH(k_accept_prep, 1, 32, stream, s, L);
    if (k >= 2)
      PD_SAMPLE_LAUNCH(k_residual_mass, dim3(nb, static_cast<unsigned int>(k - 1)), kThreads, stream, s, L);
  }
  const bool draws = s.rule == SampleRule::kTokenwise || s.rule == SampleRule::kBlockwise;
  if (!draws && s.logprobs < 0) {
    PD_SAMPLE_LAUNCH(k_decide_finish, 1, kThreads, stream, s, L);
    return;
  }
  PD_SAMPLE_LAUNCH(k_decide, 1, 32, stream, s, L);
  if (draws) PD_SAMPLE_LAUNCH(k_draw, nb, kThreads, stream, s, L);
  if (s.logprobs >= 0)
    PD_SAMPLE_LAUNCH(k_logprobs, dim3(nb, static_cast<unsigned int>(s.rows)), kThreads, stream, s, L);
  PD_SAMPLE_LAUNCH(k_finish, 1, kThreads, stream, s, L);
}

}  // namespace pd::cuda::smp

namespace pd::cuda {

int64_t sample_scratch_bytes(int rows, int draft_rows, int vocab, int logprobs) {
  int64_t bytes = 0;
  smp::layout_of(nullptr, rows, draft_rows, vocab, logprobs, &bytes);
  return bytes;
}

void launch_sample(const SampleLaunch& s, cudaStream_t stream) {
  smp::launch_sample_impl(s, stream);
}

}  // namespace pd::cuda
