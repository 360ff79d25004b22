// The sampler: one logits row -> the processed probability distribution over the kept tokens -> a token.
//
// process_logits() is the ONE implementation of "logits row -> distribution" that the plain decode path,
// the drafter and the speculative verifier all use, so that acceptance rules compare exactly the
// distributions the non-speculative sampler would sample from. It follows vLLM's v1 sampler order:
//   1. logit_bias is added;
//   2. repetition penalty (HF/CTRL: positive logits / r, negative * r) on prompt + output tokens;
//   3. frequency (per count) and presence (once) penalties on output tokens (OpenAI);
//   4. greedy (temperature 0): a point mass on the argmax, lowest token id on ties; top-k/p, min-p unused;
//   5. softmax(logits / T) in double;
//   6. min_p: drop p < min_p * p_max;  7. top_k;  8. top_p (smallest prefix of the (p desc, id asc) order
//      whose mass reaches top_p, computed on the renormalised top-k set);
//   9. renormalise over the kept tokens (double sums).
// Ties in top-k/top-p are broken by (p desc, id asc), so the kept set never depends on scan order.
//
// Logprobs (OpenAI logprobs/top_logprobs) are those of the final sampling distribution, i.e. after bias,
// penalties, temperature and truncation: masked tokens have -inf and are never listed. This is vLLM's
// logprobs_mode="processed_logprobs". Greedy rows report the temperature-1 softmax of the penalised logits
// without truncation, as vLLM's greedy path does, because the point mass would say nothing.
//
// Tests: sampler_test.cpp compares every stage with naive full-sort references.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "puredrive/decode/sampling_params.h"
#include "puredrive/decode/seeded_noise.h"
#include "puredrive/decode/token_history.h"
#include "puredrive/util/status.h"

namespace pd {

// A processed next-token distribution over the full vocabulary. Reuse one object per row: the vectors
// keep their capacity.
struct TokenDistribution {
  std::vector<float> logits;  // [V] after logit bias and penalties, before temperature
  std::vector<double> probs;  // [V] the sampling distribution; exactly 0 for masked tokens
  std::vector<int32_t> kept;  // ids with probs > 0, ascending
  int32_t argmax = -1;        // argmax of `logits`, lowest id on ties (the greedy token)
  bool greedy = false;        // temperature 0: probs is the point mass on argmax

  int32_t vocab_size() const { return static_cast<int32_t>(probs.size()); }
  double prob(int32_t token) const { return probs[token]; }
};

// `params` must have passed validate(); `history` may be null when the params have no penalties.
// Fails (kInternal) on a NaN or +inf logit, naming the token, and when every logit is -inf.
Status process_logits(std::span<const float> logits, const SamplingParams& params,
                      const TokenHistory* history, TokenDistribution* out);

// Builds a distribution straight from probabilities (tests, synthetic models, reduced-vocabulary drafts).
// The weights need not be normalised; negative or non-finite weights are a programmer error.
TokenDistribution distribution_from_weights(std::span<const double> weights);

// Inverse-CDF draw over dist.kept (ascending ids), one rng.uniform() per call.
int32_t sample(const TokenDistribution& dist, Rng& rng);

// Seeded exact mode: argmax over kept tokens of log p(v) + gumbel(seed, position, v); ties (measure zero)
// to the lowest id. Greedy distributions return their argmax.
int32_t sample_seeded(const TokenDistribution& dist, uint64_t seed, int64_t position);

// Draw from unnormalised non-negative weights over `ids` (inverse CDF in the order given). Returns -1
// when the total weight is 0.
int32_t sample_weighted(std::span<const int32_t> ids, std::span<const double> weights, Rng& rng);

struct TokenLogprob {
  int32_t token = -1;
  double logprob = 0.0;
};

// See the header comment for which distribution these describe.
double token_logprob(const TokenDistribution& dist, int32_t token);
// The n most likely tokens, (logprob desc, id asc); fewer when fewer tokens have a finite logprob.
std::vector<TokenLogprob> top_logprobs(const TokenDistribution& dist, int n);

}  // namespace pd
