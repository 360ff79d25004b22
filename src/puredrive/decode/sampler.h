// The sampler: one logits row -> the processed probability distribution over the kept tokens -> a token.
//
// process_logits() is the ONE implementation of "logits row -> distribution" that the plain decode path,
// the drafter and the speculative verifier all use, so that acceptance rules compare exactly the
// distributions the non-speculative sampler would sample from. Its math, and the order of its steps
// (vLLM's v1 sampler: logit_bias; repetition penalty on prompt + output tokens; frequency and presence
// penalties on output tokens; greedy = argmax; temperature; min_p; top_k; top_p; renormalise), is the
// reference of backend/cpu/sampling.h, which the backends' sample op reproduces bit for bit on the device.
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

#include "puredrive/backend/cpu/sampling.h"
#include "puredrive/decode/sampling_params.h"
#include "puredrive/decode/seeded_noise.h"
#include "puredrive/decode/token_history.h"
#include "puredrive/util/status.h"

namespace pd {

// The row-processing part of params, as the backends' sample op takes it.
SampleParams sample_params(const SamplingParams& params);

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

struct TokenLogprob {
  int32_t token = -1;
  double logprob = 0.0;
};

// See the header comment for which distribution these describe.
double token_logprob(const TokenDistribution& dist, int32_t token);
// The n most likely tokens, (logprob desc, id asc); fewer when fewer tokens have a finite logprob.
std::vector<TokenLogprob> top_logprobs(const TokenDistribution& dist, int n);

}  // namespace pd
