#include "puredrive/decode/acceptance.h"

#include <algorithm>
#include <vector>

namespace pd {
namespace {

using testonly::FaultyRule;

void check_input(AcceptRule rule, const VerifyInput& in) {
  const size_t k = in.drafts.size();
  PD_ASSERT(in.target.size() == k + 1, "verify: {} drafts need {} target rows, got {}", k, k + 1,
            in.target.size());
  if (rule == AcceptRule::kTokenwise || rule == AcceptRule::kBlock) {
    PD_ASSERT(in.draft.size() == k, "verify ({}): {} drafts need {} draft distributions, got {}",
              accept_rule_name(rule), k, k, in.draft.size());
  }
  const int32_t vocab = in.target[0].vocab_size();
  for (size_t j = 0; j < k; ++j) {
    PD_ASSERT(in.drafts[j] >= 0 && in.drafts[j] < vocab, "draft {} is token {}, outside [0, {})", j + 1,
              in.drafts[j], vocab);
  }
}

// p(d) / q(d) for a draft drawn from q.
double draft_ratio(const TokenDistribution& p, const TokenDistribution& q, int32_t d, size_t j) {
  const double qd = q.prob(d);
  PD_ASSERT(qd > 0.0, "draft {} (token {}) has draft probability 0: it was not drawn from q_{}", j + 1, d,
            j + 1);
  return p.prob(d) / qd;
}

// y ~ norm(max(0, scale * p - q)). The support lies inside p's kept set. A zero total is reachable only
// through rounding (mathematically the rules never pick an empty residual); then y ~ p.
int32_t sample_residual(double scale, const TokenDistribution& p, const TokenDistribution& q, Rng& rng) {
  std::vector<double> weights(p.kept.size());
  for (size_t i = 0; i < p.kept.size(); ++i) {
    const int32_t t = p.kept[i];
    weights[i] = std::max(0.0, scale * p.prob(t) - q.prob(t));
  }
  const int32_t y = sample_weighted(p.kept, weights, rng);
  return y >= 0 ? y : sample(p, rng);
}

double residual_mass(double scale, const TokenDistribution& p, const TokenDistribution& q) {
  double z = 0.0;
  for (int32_t t : p.kept) z += std::max(0.0, scale * p.prob(t) - q.prob(t));
  return z;
}

AcceptResult accept_greedy(const VerifyInput& in) {
  const size_t k = in.drafts.size();
  for (size_t j = 0; j < k; ++j) {
    const int32_t best = in.target[j].argmax;
    if (in.drafts[j] != best) return {static_cast<int>(j), best};
  }
  return {static_cast<int>(k), in.target[k].argmax};
}

AcceptResult accept_seeded(const VerifyInput& in) {
  const size_t k = in.drafts.size();
  for (size_t j = 0; j < k; ++j) {
    const int32_t own = sample_seeded(in.target[j], in.seed, in.first_position + static_cast<int64_t>(j));
    if (in.drafts[j] != own) return {static_cast<int>(j), own};
  }
  return {static_cast<int>(k),
          sample_seeded(in.target[k], in.seed, in.first_position + static_cast<int64_t>(k))};
}

AcceptResult accept_tokenwise(const VerifyInput& in, Rng& rng, bool resample_target) {
  const size_t k = in.drafts.size();
  for (size_t j = 0; j < k; ++j) {
    const TokenDistribution& p = in.target[j];
    const TokenDistribution& q = in.draft[j];
    const double r = rng.uniform();
    if (r <= std::min(1.0, draft_ratio(p, q, in.drafts[j], j))) continue;
    const int32_t y = resample_target ? sample(p, rng) : sample_residual(1.0, p, q, rng);
    return {static_cast<int>(j), y};
  }
  return {static_cast<int>(k), sample(in.target[k], rng)};
}

// Sun et al. 2025, Algorithm 2, with the spec's indexing: target[i] = p_i, draft[i - 1] = q_i.
AcceptResult accept_block(const VerifyInput& in, Rng& rng, bool cap, bool stop_at_first_failure) {
  const size_t k = in.drafts.size();
  std::vector<double> big_p(k + 1);  // P_0..P_k
  big_p[0] = 1.0;
  size_t tau = 0;
  bool failed = false;
  for (size_t i = 1; i <= k; ++i) {
    const double ratio = draft_ratio(in.target[i - 1], in.draft[i - 1], in.drafts[i - 1], i - 1);
    big_p[i] = cap ? std::min(1.0, big_p[i - 1] * ratio) : big_p[i - 1] * ratio;
    double h = big_p[i];
    if (i < k) {
      // Z_i + 1 - P_i = 0 means P_i = 1 and p_i = q_{i+1}: then every later h is 1 or the chain reaches
      // h_k = P_k = 1, so tau > i surely and h_i is irrelevant; 0 avoids a 0/0 and an empty residual.
      const double z = residual_mass(big_p[i], in.target[i], in.draft[i]);
      const double denom = z + 1.0 - big_p[i];
      h = denom > 0.0 ? z / denom : 0.0;
    }
    const double eta = rng.uniform();
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
  const int32_t y =
      tau == k ? sample(in.target[k], rng) : sample_residual(big_p[tau], in.target[tau], in.draft[tau], rng);
  return {static_cast<int>(tau), y};
}

}  // namespace

const char* accept_rule_name(AcceptRule rule) {
  switch (rule) {
    case AcceptRule::kGreedy:
      return "greedy";
    case AcceptRule::kTokenwise:
      return "tokenwise";
    case AcceptRule::kBlock:
      return "block";
    case AcceptRule::kSeeded:
      return "seeded";
  }
  return "unknown";
}

AcceptRule choose_accept_rule(const SamplingParams& params, bool block_verification) {
  if (params.is_greedy()) return AcceptRule::kGreedy;
  if (params.seed.has_value()) return AcceptRule::kSeeded;
  return block_verification ? AcceptRule::kBlock : AcceptRule::kTokenwise;
}

int32_t draw_token(AcceptRule rule, const TokenDistribution& dist, Rng& rng, uint64_t seed,
                   int64_t position) {
  switch (rule) {
    case AcceptRule::kGreedy:
      return dist.argmax;
    case AcceptRule::kSeeded:
      return sample_seeded(dist, seed, position);
    case AcceptRule::kTokenwise:
    case AcceptRule::kBlock:
      return sample(dist, rng);
  }
  PD_ASSERT(false, "draw_token: unknown rule {}", static_cast<int>(rule));
  return -1;
}

const char* Verifier::name() const {
  return faulty_ != 0 ? testonly::faulty_rule_name(static_cast<FaultyRule>(faulty_))
                      : accept_rule_name(rule_);
}

AcceptResult Verifier::accept(const VerifyInput& in, Rng& rng) const {
  check_input(rule_, in);
  switch (static_cast<FaultyRule>(faulty_)) {
    case FaultyRule::kBlockUncapped:
      return accept_block(in, rng, /*cap=*/false, /*stop_at_first_failure=*/false);
    case FaultyRule::kBlockFirstFailure:
      return accept_block(in, rng, true, true);
    case FaultyRule::kTokenwiseResampleTarget:
      return accept_tokenwise(in, rng, /*resample_target=*/true);
  }
  switch (rule_) {
    case AcceptRule::kGreedy:
      return accept_greedy(in);
    case AcceptRule::kSeeded:
      return accept_seeded(in);
    case AcceptRule::kTokenwise:
      return accept_tokenwise(in, rng, false);
    case AcceptRule::kBlock:
      return accept_block(in, rng, true, false);
  }
  PD_ASSERT(false, "Verifier: unknown rule {}", static_cast<int>(rule_));
  return {};
}

namespace testonly {

const char* faulty_rule_name(FaultyRule rule) {
  switch (rule) {
    case FaultyRule::kBlockUncapped:
      return "faulty:block-uncapped";
    case FaultyRule::kBlockFirstFailure:
      return "faulty:block-first-failure";
    case FaultyRule::kTokenwiseResampleTarget:
      return "faulty:tokenwise-resample-target";
  }
  return "faulty:unknown";
}

Verifier faulty_verifier(FaultyRule rule) {
  Verifier v(rule == FaultyRule::kTokenwiseResampleTarget ? AcceptRule::kTokenwise : AcceptRule::kBlock);
  v.faulty_ = static_cast<int>(rule);
  return v;
}

}  // namespace testonly
}  // namespace pd
