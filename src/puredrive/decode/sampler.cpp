#include "puredrive/decode/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace pd {

SampleParams sample_params(const SamplingParams& p) {
  return {.temperature = p.temperature,
          .top_k = p.top_k,
          .top_p = p.top_p,
          .min_p = p.min_p,
          .presence_penalty = p.presence_penalty,
          .frequency_penalty = p.frequency_penalty,
          .repetition_penalty = p.repetition_penalty};
}

Status process_logits(std::span<const float> logits, const SamplingParams& params,
                      const TokenHistory* history, TokenDistribution* out) {
  const auto vocab = static_cast<int32_t>(logits.size());
  if (vocab == 0) return make_error(ErrorCode::kInternal, "sampler: empty logits row");
  std::vector<sampling::LogitBias> bias;
  for (const auto& [token, b] : params.logit_bias) {
    if (token < vocab) bias.push_back({token, b});
  }
  std::vector<sampling::Penalty> penalties;
  if (params.has_penalties()) {
    PD_ASSERT(history != nullptr, "sampling params with penalties need a TokenHistory");
    PD_ASSERT(history->vocab_size() == vocab, "TokenHistory has vocab {}, logits row has {}",
              history->vocab_size(), vocab);
    for (int32_t t : history->seen_tokens()) {
      penalties.push_back(
          {.token = t, .count = history->output_count(t), .in_prompt = history->in_prompt(t)});
    }
  }
  const sampling::RowStatus s = sampling::process_row(logits, sample_params(params), bias, penalties, out);
  switch (s.status) {
    case SampleStatus::kOk:
      return Status::ok();
    case SampleStatus::kNonFinite:
      return make_error(ErrorCode::kInternal, "sampler: logits row has {} at token {} (vocab {})",
                        s.token < vocab && s.token >= 0 ? logits[s.token] : 0.0f, s.token, vocab);
    case SampleStatus::kAllMasked:
      return make_error(ErrorCode::kInternal, "sampler: every logit of the row is -inf (vocab {})", vocab);
    default:
      return make_error(ErrorCode::kInternal, "sampler: status {}", static_cast<int>(s.status));
  }
}

TokenDistribution distribution_from_weights(std::span<const double> weights) {
  TokenDistribution dist;
  sampling::distribution_from_weights(weights, &dist);
  return dist;
}

int32_t sample(const TokenDistribution& dist, Rng& rng) {
  return sampling::draw(dist, rng.uniform());
}

int32_t sample_seeded(const TokenDistribution& dist, uint64_t seed, int64_t position) {
  if (dist.greedy) return dist.argmax;
  return sampling::draw_seeded(dist, seed, position);
}

double token_logprob(const TokenDistribution& dist, int32_t token) {
  if (dist.greedy) {
    return static_cast<double>(dist.logits[token]) - sampling::raw_log_normaliser(dist.logits);
  }
  return dist.probs[token] > 0.0 ? std::log(dist.probs[token]) : -std::numeric_limits<double>::infinity();
}

std::vector<TokenLogprob> top_logprobs(const TokenDistribution& dist, int n) {
  std::vector<TokenLogprob> result;
  if (n <= 0) return result;
  if (dist.greedy) {
    const double lse = sampling::raw_log_normaliser(dist.logits);
    for (int32_t t : sampling::top_logit_ids(dist.logits, n)) {
      if (!std::isfinite(dist.logits[t])) break;
      result.push_back({t, static_cast<double>(dist.logits[t]) - lse});
    }
    return result;
  }
  std::vector<int32_t> ids = dist.kept;
  const size_t m = std::min<size_t>(static_cast<size_t>(n), ids.size());
  const auto& p = dist.probs;
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(m), ids.end(),
                    [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  for (size_t i = 0; i < m; ++i) result.push_back({ids[i], std::log(p[ids[i]])});
  return result;
}

}  // namespace pd
