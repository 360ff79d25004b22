#include "puredrive/decode/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace pd {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Strict total order (p desc, id asc): the kept set of top-k / top-p is then unique, whatever the
// algorithm's scan order.
struct ProbDescIdAsc {
  const double* p;
  bool operator()(int32_t a, int32_t b) const { return p[a] > p[b] || (p[a] == p[b] && a < b); }
};

void apply_bias_and_penalties(const SamplingParams& params, const TokenHistory* history, float* z,
                              int32_t vocab) {
  for (const auto& [token, bias] : params.logit_bias) {
    if (token < vocab) z[token] += bias;
  }
  if (!params.has_penalties()) return;
  PD_ASSERT(history != nullptr, "sampling params with penalties need a TokenHistory");
  PD_ASSERT(history->vocab_size() == vocab, "TokenHistory has vocab {}, logits row has {}",
            history->vocab_size(), vocab);
  const float r = params.repetition_penalty;
  for (int32_t t : history->seen_tokens()) {
    float v = z[t];
    if (r != 1.0f) v = v > 0.0f ? v / r : v * r;
    const int32_t count = history->output_count(t);
    if (count > 0) {
      v -= params.frequency_penalty * static_cast<float>(count);
      v -= params.presence_penalty;
    }
    z[t] = v;
  }
}

// Buckets for top-k and top-p: the bit pattern of a positive double is monotone in its value, so its top 16
// bits (exponent + 4 mantissa bits) order weights in 16 buckets per octave. Weights in (0, 1] from 2^-64 up
// get their own buckets; everything smaller shares bucket 0.
constexpr int kBucketShift = 48;
constexpr uint64_t kBucketLowKey = (1023 - 64) << 4;
constexpr int kNumBuckets = static_cast<int>((1023 << 4) + 16 - kBucketLowKey) + 1;

int weight_bucket(double w) {
  uint64_t bits;
  std::memcpy(&bits, &w, sizeof bits);
  const uint64_t key = bits >> kBucketShift;
  return key < kBucketLowKey ? 0
                             : static_cast<int>(std::min<uint64_t>(key - kBucketLowKey + 1, kNumBuckets - 1));
}

// Keeps the top-k of `kept` by (p desc, id asc) and zeroes the probabilities of the rest; kept stays
// ascending. Buckets above the one where the count reaches k are kept whole; only that bucket is
// partially selected.
void apply_top_k(int32_t k, std::vector<int32_t>& kept, std::vector<double>& probs) {
  if (k <= 0 || static_cast<size_t>(k) >= kept.size()) return;
  std::vector<int32_t> bucket_count(kNumBuckets, 0);
  for (int32_t t : kept) ++bucket_count[weight_bucket(probs[t])];
  int b = kNumBuckets - 1;
  int32_t above = 0;
  while (above + bucket_count[b] < k) above += bucket_count[b--];
  std::vector<int32_t> bucket;
  for (int32_t t : kept) {
    if (weight_bucket(probs[t]) == b) bucket.push_back(t);
  }
  const ProbDescIdAsc order{probs.data()};
  const auto need = static_cast<size_t>(k - above);
  std::nth_element(bucket.begin(), bucket.begin() + (need - 1), bucket.end(), order);
  const int32_t last = bucket[need - 1];  // the k-th token in (p desc, id asc) order
  size_t w = 0;
  for (int32_t t : kept) {
    if (t == last || order(t, last)) {
      kept[w++] = t;
    } else {
      probs[t] = 0.0;
    }
  }
  kept.resize(w);
}

// Keeps the smallest (p desc, id asc) prefix whose mass reaches top_p of the kept mass: token i stays iff
// the mass strictly before it is < top_p * total (HF's and vLLM's "cumsum of the ascending sort <= 1 - p
// is removed"). Whole buckets above the crossing are kept without sorting; only the tokens of the bucket
// where the mass crosses the threshold are sorted, so a large nucleus costs O(V), not O(V log V).
void apply_top_p(double top_p, std::vector<int32_t>& kept, std::vector<double>& probs) {
  if (top_p >= 1.0 || kept.size() <= 1) return;
  double total = 0.0;  // in ascending id order, like every sum of the sampler
  std::vector<double> bucket_mass(kNumBuckets, 0.0);
  for (int32_t t : kept) {
    total += probs[t];
    bucket_mass[weight_bucket(probs[t])] += probs[t];
  }
  const double threshold = top_p * total;
  // Buckets that end before the threshold are kept whole.
  int b = kNumBuckets - 1;
  double before = 0.0;
  while (b > 0 && before + bucket_mass[b] < threshold) before += bucket_mass[b--];
  // Walk the crossing bucket (and lower ones, should rounding leave it short) in (p desc, id asc) order.
  const ProbDescIdAsc order{probs.data()};
  int32_t last = -1;  // the last kept token in that order
  std::vector<int32_t> bucket;
  for (; b >= 0 && before < threshold; --b) {
    bucket.clear();
    for (int32_t t : kept) {
      if (weight_bucket(probs[t]) == b) bucket.push_back(t);
    }
    std::sort(bucket.begin(), bucket.end(), order);
    for (int32_t t : bucket) {
      if (before >= threshold) break;
      before += probs[t];
      last = t;
    }
  }
  size_t w = 0;
  for (int32_t t : kept) {
    if (last < 0 || t == last || order(t, last)) {
      kept[w++] = t;
    } else {
      probs[t] = 0.0;
    }
  }
  kept.resize(w);
}

// Normalises probs over kept (ascending ids, double sum) and drops tokens that underflow to 0.
void normalise(std::vector<int32_t>& kept, std::vector<double>& probs) {
  double total = 0.0;
  for (int32_t t : kept) total += probs[t];
  size_t w = 0;
  for (int32_t t : kept) {
    probs[t] /= total;
    if (probs[t] > 0.0) kept[w++] = t;
  }
  kept.resize(w);
}

int32_t argmax_lowest_id(std::span<const float> z) {
  int32_t best = 0;
  for (int32_t v = 1; v < static_cast<int32_t>(z.size()); ++v) {
    if (z[v] > z[best]) best = v;
  }
  return best;
}

// log-sum-exp of the logits at temperature 1 (the greedy rows' logprob basis).
double log_normaliser(const TokenDistribution& dist) {
  const double m = dist.logits[dist.argmax];
  double sum = 0.0;
  for (float z : dist.logits) sum += std::exp(static_cast<double>(z) - m);
  return m + std::log(sum);
}

}  // namespace

Status process_logits(std::span<const float> logits, const SamplingParams& params,
                      const TokenHistory* history, TokenDistribution* out) {
  const auto vocab = static_cast<int32_t>(logits.size());
  if (vocab == 0) return make_error(ErrorCode::kInternal, "sampler: empty logits row");
  for (int32_t v = 0; v < vocab; ++v) {
    if (std::isnan(logits[v]) || logits[v] == std::numeric_limits<float>::infinity()) {
      return make_error(ErrorCode::kInternal, "sampler: logits row has {} at token {} (vocab {})", logits[v],
                        v, vocab);
    }
  }
  out->logits.assign(logits.begin(), logits.end());
  apply_bias_and_penalties(params, history, out->logits.data(), vocab);
  out->argmax = argmax_lowest_id(out->logits);
  const double max_logit = out->logits[out->argmax];
  if (max_logit == -std::numeric_limits<double>::infinity()) {
    return make_error(ErrorCode::kInternal, "sampler: every logit of the row is -inf (vocab {})", vocab);
  }

  out->probs.assign(vocab, 0.0);
  out->kept.clear();
  out->greedy = params.is_greedy();
  if (out->greedy) {
    out->probs[out->argmax] = 1.0;
    out->kept.push_back(out->argmax);
    return Status::ok();
  }

  // exp((z - z_max) / T): the argmax gets exactly 1, so min_p compares against min_p itself.
  const double temperature = params.temperature;
  const double min_w = params.min_p;
  for (int32_t v = 0; v < vocab; ++v) {
    const double w = std::exp((static_cast<double>(out->logits[v]) - max_logit) / temperature);
    if (w > 0.0 && w >= min_w) {
      out->probs[v] = w;
      out->kept.push_back(v);
    }
  }
  apply_top_k(params.top_k, out->kept, out->probs);
  apply_top_p(params.top_p, out->kept, out->probs);
  normalise(out->kept, out->probs);
  return Status::ok();
}

TokenDistribution distribution_from_weights(std::span<const double> weights) {
  TokenDistribution dist;
  const auto vocab = static_cast<int32_t>(weights.size());
  PD_ASSERT(vocab > 0, "distribution_from_weights: empty weights");
  dist.logits.resize(vocab);
  dist.probs.assign(weights.begin(), weights.end());
  for (int32_t v = 0; v < vocab; ++v) {
    PD_ASSERT(std::isfinite(weights[v]) && weights[v] >= 0.0,
              "weight {} of token {} is not a finite value >= 0", weights[v], v);
    dist.logits[v] =
        weights[v] > 0.0 ? static_cast<float>(std::log(weights[v])) : -std::numeric_limits<float>::infinity();
    if (weights[v] > 0.0) dist.kept.push_back(v);
  }
  PD_ASSERT(!dist.kept.empty(), "distribution_from_weights: all weights are 0");
  normalise(dist.kept, dist.probs);
  dist.argmax = 0;
  for (int32_t v = 1; v < vocab; ++v) {
    if (dist.probs[v] > dist.probs[dist.argmax]) dist.argmax = v;
  }
  return dist;
}

int32_t sample_weighted(std::span<const int32_t> ids, std::span<const double> weights, Rng& rng) {
  PD_DCHECK(ids.size() == weights.size());
  double total = 0.0;
  for (double w : weights) total += w;
  const double u = rng.uniform();
  if (!(total > 0.0)) return -1;
  const double x = u * total;
  double cum = 0.0;
  int32_t last = -1;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (weights[i] <= 0.0) continue;
    cum += weights[i];
    last = ids[i];
    if (x < cum) return ids[i];
  }
  return last;  // x landed on the rounding gap between cum and total
}

int32_t sample(const TokenDistribution& dist, Rng& rng) {
  double total = 0.0;
  for (int32_t t : dist.kept) total += dist.probs[t];
  const double x = rng.uniform() * total;
  double cum = 0.0;
  for (int32_t t : dist.kept) {
    cum += dist.probs[t];
    if (x < cum) return t;
  }
  return dist.kept.back();
}

int32_t sample_seeded(const TokenDistribution& dist, uint64_t seed, int64_t position) {
  if (dist.greedy) return dist.argmax;
  int32_t best_token = -1;
  double best = kNegInf;
  for (int32_t t : dist.kept) {
    const double score = std::log(dist.probs[t]) + gumbel_noise(seed, position, t);
    if (best_token < 0 || score > best) {
      best = score;
      best_token = t;
    }
  }
  return best_token;
}

double token_logprob(const TokenDistribution& dist, int32_t token) {
  if (dist.greedy) return static_cast<double>(dist.logits[token]) - log_normaliser(dist);
  return dist.probs[token] > 0.0 ? std::log(dist.probs[token]) : kNegInf;
}

std::vector<TokenLogprob> top_logprobs(const TokenDistribution& dist, int n) {
  std::vector<TokenLogprob> result;
  if (n <= 0) return result;
  if (dist.greedy) {
    std::vector<int32_t> ids;
    for (int32_t v = 0; v < dist.vocab_size(); ++v) {
      if (std::isfinite(dist.logits[v])) ids.push_back(v);
    }
    const size_t m = std::min<size_t>(n, ids.size());
    const auto& z = dist.logits;
    std::partial_sort(ids.begin(), ids.begin() + m, ids.end(),
                      [&](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });
    const double lse = log_normaliser(dist);
    for (size_t i = 0; i < m; ++i) result.push_back({ids[i], static_cast<double>(z[ids[i]]) - lse});
    return result;
  }
  std::vector<int32_t> ids = dist.kept;
  const size_t m = std::min<size_t>(n, ids.size());
  std::partial_sort(ids.begin(), ids.begin() + m, ids.end(), ProbDescIdAsc{dist.probs.data()});
  for (size_t i = 0; i < m; ++i) result.push_back({ids[i], std::log(dist.probs[ids[i]])});
  return result;
}

}  // namespace pd
