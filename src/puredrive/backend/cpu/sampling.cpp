// The reference sampler (sampling.h): row processing, draws and the acceptance rules.
#include "puredrive/backend/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

namespace pd::sampling {
namespace {

// Strict total order (w desc, id asc): the kept set of top-k / top-p is then unique, whatever the
// algorithm's scan order.
struct WeightDescIdAsc {
  const double* w;
  bool operator()(int32_t a, int32_t b) const { return w[a] > w[b] || (w[a] == w[b] && a < b); }
};

// Buckets for top-k and top-p: the bit pattern of a positive double is monotone in its value, so its top 16
// bits (exponent + 4 mantissa bits) order weights in 16 buckets per octave. Weights in (0, 1] from 2^-64 up
// get their own buckets; everything smaller shares bucket 0.
constexpr int kBucketShift = 48;
constexpr uint64_t kBucketLowKey = (1023 - 64) << 4;
constexpr int kNumBuckets = static_cast<int>((1023 << 4) + 16 - kBucketLowKey) + 1;

int weight_bucket(double w) {
  const uint64_t key = double_bits(w) >> kBucketShift;
  return key < kBucketLowKey ? 0
                             : static_cast<int>(std::min<uint64_t>(key - kBucketLowKey + 1, kNumBuckets - 1));
}

// Keeps the top-k of `kept` by (w desc, id asc) and zeroes the weights of the rest; kept stays ascending.
// Buckets above the one where the count reaches k are kept whole; only that bucket is partially selected.
void apply_top_k(int32_t k, std::vector<int32_t>& kept, std::vector<double>& w) {
  if (k <= 0 || static_cast<size_t>(k) >= kept.size()) return;
  std::vector<int32_t> bucket_count(kNumBuckets, 0);
  for (int32_t t : kept) ++bucket_count[weight_bucket(w[t])];
  int b = kNumBuckets - 1;
  int32_t above = 0;
  while (above + bucket_count[b] < k) above += bucket_count[b--];
  std::vector<int32_t> bucket;
  for (int32_t t : kept) {
    if (weight_bucket(w[t]) == b) bucket.push_back(t);
  }
  const WeightDescIdAsc order{w.data()};
  const auto need = static_cast<size_t>(k - above);
  std::nth_element(bucket.begin(), bucket.begin() + static_cast<std::ptrdiff_t>(need - 1), bucket.end(),
                   order);
  const int32_t last = bucket[need - 1];  // the k-th token in (w desc, id asc) order
  size_t n = 0;
  for (int32_t t : kept) {
    if (t == last || order(t, last)) {
      kept[n++] = t;
    } else {
      w[t] = 0.0;
    }
  }
  kept.resize(n);
}

// Keeps the (w desc, id asc) prefix of tokens whose mass strictly before them, B, has double(B) < top_p *
// double(M). Masses are exact integers, so whole buckets above the crossing are summed without sorting and
// only the bucket where the mass crosses the threshold is sorted: a large nucleus costs O(V), not O(V log V).
void apply_top_p(double top_p, std::vector<int32_t>& kept, std::vector<double>& w) {
  if (top_p >= 1.0 || kept.size() <= 1) return;
  U128 total{};
  std::vector<U128> bucket_mass(kNumBuckets);
  for (int32_t t : kept) {
    const U128 m = to_fixed(w[t]);
    total = add(total, m);
    U128& bm = bucket_mass[weight_bucket(w[t])];
    bm = add(bm, m);
  }
  const double threshold = top_p * to_double(total);
  // A bucket whose end stays below the threshold is kept whole (double() is monotone).
  int b = kNumBuckets - 1;
  U128 before{};
  while (b > 0 && to_double(add(before, bucket_mass[b])) < threshold) before = add(before, bucket_mass[b--]);
  const WeightDescIdAsc order{w.data()};
  int32_t last = -1;  // the last kept token in that order
  std::vector<int32_t> bucket;
  for (; b >= 0 && to_double(before) < threshold; --b) {
    bucket.clear();
    for (int32_t t : kept) {
      if (weight_bucket(w[t]) == b) bucket.push_back(t);
    }
    std::sort(bucket.begin(), bucket.end(), order);
    for (int32_t t : bucket) {
      if (!(to_double(before) < threshold)) break;
      before = add(before, to_fixed(w[t]));
      last = t;
    }
  }
  size_t n = 0;
  for (int32_t t : kept) {
    if (last < 0 || t == last || order(t, last)) {
      kept[n++] = t;
    } else {
      w[t] = 0.0;
    }
  }
  kept.resize(n);
}

// mass, W and probs from the final weights and kept set.
void finish(TokenDistribution* d) {
  U128 mass{};
  for (int32_t t : d->kept) mass = add(mass, to_fixed(d->weights[t]));
  d->mass = mass;
  d->mass_weight = to_double(mass) * kFixedUnit;
  d->probs.assign(d->weights.size(), 0.0);
  for (int32_t t : d->kept) d->probs[t] = d->weights[t] / d->mass_weight;
}

// The inverse CDF over ids in ascending order with integer masses; -1 when the total is 0.
template <typename MassFn>
int32_t draw_by_mass(std::span<const int32_t> ids, U128 total, double u, const MassFn& mass) {
  if (is_zero(total)) return -1;
  const U128 x = mul_frac(total, unit_fraction(u));  // < total
  U128 cum{};
  int32_t last = -1;
  for (int32_t t : ids) {
    const U128 m = mass(t);
    if (is_zero(m)) continue;
    cum = add(cum, m);
    last = t;
    if (less(x, cum)) return t;
  }
  return last;
}

}  // namespace

RowStatus process_row(std::span<const float> logits, const SampleParams& params,
                      std::span<const LogitBias> bias, std::span<const Penalty> penalties,
                      TokenDistribution* out) {
  const auto vocab = static_cast<int32_t>(logits.size());
  for (int32_t v = 0; v < vocab; ++v) {
    if (std::isnan(logits[v]) || logits[v] == std::numeric_limits<float>::infinity()) {
      return {SampleStatus::kNonFinite, v};
    }
  }
  std::vector<float>& z = out->logits;
  z.assign(logits.begin(), logits.end());
  for (const LogitBias& b : bias) {
    if (b.bias != 0.0f) z[b.token] += b.bias;
  }
  if (params.penalised()) {
    for (const Penalty& p : penalties) {
      z[p.token] = penalised_logit(z[p.token], p.in_prompt || p.count > 0, p.count, params.repetition_penalty,
                                   params.frequency_penalty, params.presence_penalty);
    }
  }
  int32_t best = 0;
  for (int32_t v = 1; v < vocab; ++v) {
    if (z[v] > z[best]) best = v;
  }
  out->argmax = best;
  if (z[best] == -std::numeric_limits<float>::infinity()) return {SampleStatus::kAllMasked, -1};
  // A penalty can overflow a huge logit to +inf; then no weight is defined.
  if (z[best] == std::numeric_limits<float>::infinity()) return {SampleStatus::kNonFinite, best};

  out->greedy = params.greedy();
  out->weights.assign(static_cast<size_t>(vocab), 0.0);
  out->kept.clear();
  if (out->greedy) {
    out->weights[best] = 1.0;
    out->kept.push_back(best);
    finish(out);
    return {};
  }
  // z_max as +0 when the maximum is a zero of either sign, as the GPU's argmax key sees it.
  const double z_max = static_cast<double>(z[best]) + 0.0;
  const double temperature = params.temperature;
  const double min_p = params.min_p;
  for (int32_t v = 0; v < vocab; ++v) {
    const double w = logit_weight(z[v], z_max, temperature);
    if (w >= kMinWeight && w >= min_p) {
      out->weights[v] = w;
      out->kept.push_back(v);
    }
  }
  apply_top_k(params.top_k, out->kept, out->weights);
  apply_top_p(params.top_p, out->kept, out->weights);
  finish(out);
  return {};
}

void distribution_from_weights(std::span<const double> weights, TokenDistribution* out) {
  const auto vocab = static_cast<int32_t>(weights.size());
  PD_ASSERT(vocab > 0, "distribution_from_weights: empty weights");
  double top = 0.0;
  for (int32_t v = 0; v < vocab; ++v) {
    PD_ASSERT(std::isfinite(weights[v]) && weights[v] >= 0.0,
              "weight {} of token {} is not a finite value >= 0", weights[v], v);
    top = std::max(top, weights[v]);
  }
  PD_ASSERT(top > 0.0, "distribution_from_weights: all weights are 0");
  out->logits.resize(static_cast<size_t>(vocab));
  out->weights.assign(static_cast<size_t>(vocab), 0.0);
  out->kept.clear();
  out->greedy = false;
  out->argmax = 0;
  for (int32_t v = 0; v < vocab; ++v) {
    out->logits[v] =
        weights[v] > 0.0 ? static_cast<float>(std::log(weights[v])) : -std::numeric_limits<float>::infinity();
    const double w = weights[v] / top;
    if (w >= kMinWeight) {
      out->weights[v] = w;
      out->kept.push_back(v);
    }
    if (weights[v] > weights[out->argmax]) out->argmax = v;
  }
  finish(out);
}

int32_t draw(const TokenDistribution& dist, double u) {
  const int32_t t =
      draw_by_mass(dist.kept, dist.mass, u, [&](int32_t v) { return to_fixed(dist.weights[v]); });
  return t >= 0 ? t : dist.argmax;
}

int32_t draw_seeded(const TokenDistribution& dist, uint64_t seed, int64_t position) {
  int32_t best_token = -1;
  double best = 0.0;
  for (int32_t t : dist.kept) {
    const double score = det_log(dist.probs[t]) + gumbel_noise(seed, position, t);
    if (best_token < 0 || score > best) {
      best = score;
      best_token = t;
    }
  }
  return best_token;
}

double residual_weight(double scale, const TokenDistribution& p, const TokenDistribution& q, int32_t t) {
  const double r = scale * p.probs[t] - q.probs[t];
  return r > 0.0 ? r : 0.0;
}

double residual_mass(double scale, const TokenDistribution& p, const TokenDistribution& q) {
  U128 z{};
  for (int32_t t : p.kept) z = add(z, to_fixed(residual_weight(scale, p, q, t)));
  return to_double(z) * kFixedUnit;
}

int32_t draw_residual(double scale, const TokenDistribution& p, const TokenDistribution& q, double u) {
  U128 total{};
  for (int32_t t : p.kept) total = add(total, to_fixed(residual_weight(scale, p, q, t)));
  // Mathematically the rules never pick an empty residual; rounding can make one, and then y ~ p.
  const int32_t y =
      draw_by_mass(p.kept, total, u, [&](int32_t t) { return to_fixed(residual_weight(scale, p, q, t)); });
  return y >= 0 ? y : draw(p, u);
}

namespace {

// p(d) / q(d) for a draft drawn from q; false when q(d) = 0.
bool draft_ratio(const TokenDistribution& p, const TokenDistribution& q, int32_t d, double* ratio) {
  const double qd = q.probs[d];
  if (!(qd > 0.0)) return false;
  *ratio = p.probs[d] / qd;
  return true;
}

AcceptOutcome accept_tokenwise(const AcceptInput& in) {
  const size_t k = in.drafts.size();
  const double u_last = in.uniforms[k];
  for (size_t j = 0; j < k; ++j) {
    const TokenDistribution& p = in.target[j];
    const TokenDistribution& q = in.draft[j];
    double ratio = 0.0;
    if (!draft_ratio(p, q, in.drafts[j], &ratio)) {
      return {.status = SampleStatus::kDraftNotInDraft, .detail = static_cast<int32_t>(j)};
    }
    if (in.uniforms[j] <= std::min(1.0, ratio)) continue;
    const int32_t y =
        in.faulty == kFaultyTokenwiseResample ? draw(p, u_last) : draw_residual(1.0, p, q, u_last);
    return {.accepted = static_cast<int>(j), .next = y};
  }
  return {.accepted = static_cast<int>(k), .next = draw(in.target[k], u_last)};
}

// Sun et al. 2025, Algorithm 2, with the spec's indexing: target[i] = p_i, draft[i - 1] = q_i.
AcceptOutcome accept_block(const AcceptInput& in) {
  const size_t k = in.drafts.size();
  const bool cap = in.faulty != kFaultyBlockUncapped;
  const bool stop_at_first_failure = in.faulty == kFaultyBlockFirstFailure;
  std::vector<double> big_p(k + 1);  // P_0..P_k
  big_p[0] = 1.0;
  size_t tau = 0;
  bool failed = false;
  for (size_t i = 1; i <= k; ++i) {
    double ratio = 0.0;
    if (!draft_ratio(in.target[i - 1], in.draft[i - 1], in.drafts[i - 1], &ratio)) {
      return {.status = SampleStatus::kDraftNotInDraft, .detail = static_cast<int32_t>(i - 1)};
    }
    big_p[i] = std::min(cap ? 1.0 : kUncappedLimit, big_p[i - 1] * ratio);
    double h = big_p[i];
    if (i < k) {
      // Z_i + 1 - P_i = 0 means P_i = 1 and p_i = q_{i+1}: then every later h is 1 or the chain reaches
      // h_k = P_k = 1, so tau > i surely and h_i is irrelevant; 0 avoids a 0/0 and an empty residual.
      const double z = residual_mass(big_p[i], in.target[i], in.draft[i]);
      const double denom = z + 1.0 - big_p[i];
      h = denom > 0.0 ? z / denom : 0.0;
    }
    const double eta = in.uniforms[i - 1];
    if (stop_at_first_failure) {
      if (!failed && eta <= h) {
        tau = i;
      } else {
        failed = true;
      }
    } else if (eta <= h) {
      tau = i;
    }
  }
  const double u_last = in.uniforms[k];
  const int32_t y = tau == k ? draw(in.target[k], u_last)
                             : draw_residual(big_p[tau], in.target[tau], in.draft[tau], u_last);
  return {.accepted = static_cast<int>(tau), .next = y};
}

}  // namespace

AcceptOutcome accept(const AcceptInput& in) {
  const size_t k = in.drafts.size();
  switch (in.rule) {
    case SampleRule::kGreedy:
      for (size_t j = 0; j < k; ++j) {
        if (in.drafts[j] != in.target[j].argmax)
          return {.accepted = static_cast<int>(j), .next = in.target[j].argmax};
      }
      return {.accepted = static_cast<int>(k), .next = in.target[k].argmax};
    case SampleRule::kSeeded:
      for (size_t j = 0; j < k; ++j) {
        const int32_t own = draw_seeded(in.target[j], in.seed, in.first_position + static_cast<int64_t>(j));
        if (in.drafts[j] != own) return {.accepted = static_cast<int>(j), .next = own};
      }
      return {.accepted = static_cast<int>(k),
              .next = draw_seeded(in.target[k], in.seed, in.first_position + static_cast<int64_t>(k))};
    case SampleRule::kTokenwise:
      return accept_tokenwise(in);
    case SampleRule::kBlock:
      return accept_block(in);
  }
  return {};
}

double raw_log_normaliser(std::span<const float> logits) {
  float top = -std::numeric_limits<float>::infinity();
  for (float z : logits) top = std::max(top, z);
  if (top == -std::numeric_limits<float>::infinity()) return -std::numeric_limits<double>::infinity();
  const double z_max = static_cast<double>(top) + 0.0;
  U128 sum{};
  for (float z : logits) sum = add(sum, to_fixed(det_exp(static_cast<double>(z) - z_max)));
  return z_max + det_log(to_double(sum) * kFixedUnit);
}

float raw_logprob(std::span<const float> logits, double log_normaliser, int32_t token) {
  return static_cast<float>(static_cast<double>(logits[token]) - log_normaliser);
}

std::vector<int32_t> top_logit_ids(std::span<const float> logits, int n) {
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  const size_t m = std::min(static_cast<size_t>(std::max(n, 0)), ids.size());
  std::partial_sort(
      ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(m), ids.end(),
      [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  ids.resize(m);
  return ids;
}

}  // namespace pd::sampling
