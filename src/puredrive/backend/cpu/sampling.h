// The sampler's math: the reference that every backend's sample op (backend.h SampleArgs) reproduces bit for
// bit, and the core of the decode layer's sampler and acceptance rules (decode/sampler.h,
// decode/acceptance.h). docs/spec/speculative.md §4 states it; sampling_math.h holds the scalar functions
// that the host and the device share.
//
// One logits row -> a processed distribution (vLLM v1's order):
//   1. z = logits + logit bias; repetition / frequency / presence penalties on the tokens seen;
//   2. argmax of z, the lowest id on ties: the greedy token; a greedy row is the point mass on it;
//   3. w_t = det_exp((z_t - z_max) / T), so the argmax has w = 1; a token is masked when w < min_p or
//      w < 2^-106 (its fixed-point mass m_t = floor(w_t 2^106) would be 0);
//   4. top_k: keep the k first tokens in the order (w desc, id asc);
//   5. top_p: keep the tokens whose mass strictly before them in that order, B_t, has
//      double(B_t) < top_p * double(M), M the mass of the tokens kept so far (HF's and vLLM's rule);
//   6. p_t = w_t / W, W = double(M') 2^-106, M' the mass of the kept tokens.
// Masses are exact integers (U128), so every sum is independent of the order it is taken in: a GPU
// reduction tree and this CPU loop agree.
//
// Drawing with a uniform u in (0, 1): X = floor(M' u) in integers; the first kept id (ascending) whose
// cumulative mass exceeds X. Seeded (position n): the kept token maximising det_log(p_t) + gumbel(seed, n,
// t), the lowest id on ties.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "puredrive/backend/backend.h"
#include "puredrive/backend/sampling_math.h"

namespace pd {

// A processed next-token distribution over the full vocabulary. Reuse one object per row: the vectors keep
// their capacity.
struct TokenDistribution {
  std::vector<float> logits;    // [V] after logit bias and penalties, before temperature
  std::vector<double> weights;  // [V] w: exactly 0 for masked tokens (greedy: 1 at the argmax)
  std::vector<double> probs;    // [V] p = w / W: the sampling distribution, 0 for masked tokens
  std::vector<int32_t> kept;    // ids with w > 0, ascending
  U128 mass{};                    // M': the fixed-point mass of the kept tokens
  double mass_weight = 0.0;     // W = double(M') 2^-106
  int32_t argmax = -1;          // argmax of `logits`, lowest id on ties (the greedy token)
  bool greedy = false;          // temperature 0: the point mass on argmax

  int32_t vocab_size() const { return static_cast<int32_t>(probs.size()); }
  double prob(int32_t token) const { return probs[token]; }
};

namespace sampling {

// Deliberately wrong acceptance variants (decode/acceptance.h testonly::FaultyRule), so that the exactness
// tests can show their power on every backend.
constexpr int32_t kFaultyBlockUncapped = 1;      // block verification without the cap P_i <= 1
constexpr int32_t kFaultyBlockFirstFailure = 2;  // block verification stopping at the first failure
constexpr int32_t kFaultyTokenwiseResample = 3;  // token-wise, y ~ p instead of the residual
constexpr double kUncappedLimit = 0x1.0p+20;     // keeps the uncapped P inside the fixed-point range

struct LogitBias {
  int32_t token = 0;
  float bias = 0.0f;
};
struct Penalty {
  int32_t token = 0;
  int32_t count = 0;  // output occurrences
  bool in_prompt = false;
};

struct RowStatus {
  SampleStatus status = SampleStatus::kOk;
  int32_t token = -1;  // kNonFinite: the first bad token
  bool ok() const { return status == SampleStatus::kOk; }
};

// Steps 1-6 above. Zero biases are skipped; each penalty entry names a distinct token.
RowStatus process_row(std::span<const float> logits, const SampleParams& params,
                      std::span<const LogitBias> bias, std::span<const Penalty> penalties,
                      TokenDistribution* out);

// The distribution proportional to non-negative finite weights (not all 0), as if they were the w of step 3
// after dividing by the largest.
void distribution_from_weights(std::span<const double> weights, TokenDistribution* out);

// Inverse CDF over the kept tokens in ascending id order, in integers.
int32_t draw(const TokenDistribution& dist, double u);
int32_t draw_seeded(const TokenDistribution& dist, uint64_t seed, int64_t position);

// max(0, scale * p_t - q_t): the residual weight of token t.
double residual_weight(double scale, const TokenDistribution& p, const TokenDistribution& q, int32_t t);
// sum over p's kept tokens of the residual weights, through fixed point.
double residual_mass(double scale, const TokenDistribution& p, const TokenDistribution& q);
// y ~ norm(max(0, scale * p - q)) with uniform u; y ~ p when the residual is empty in fixed point.
int32_t draw_residual(double scale, const TokenDistribution& p, const TokenDistribution& q, double u);

struct AcceptInput {
  SampleRule rule = SampleRule::kGreedy;
  int32_t faulty = 0;
  std::span<const int32_t> drafts;            // d_1..d_k
  std::span<const TokenDistribution> target;  // p_0..p_k
  std::span<const TokenDistribution> draft;   // q_1..q_k (kTokenwise, kBlock)
  std::span<const double> uniforms;           // k + 1 (kTokenwise, kBlock): u[j] tests d_{j+1}, u[k] draws y
  uint64_t seed = 0;                          // kSeeded
  int64_t first_position = 0;                 // absolute position of d_1 (kSeeded)
};
struct AcceptOutcome {
  int accepted = 0;
  int32_t next = -1;
  SampleStatus status = SampleStatus::kOk;  // kDraftNotInDraft
  int32_t detail = 0;                       // the draft's index
};
// The rules of docs/spec/speculative.md §2 (decode/acceptance.h describes them). Drafts must be in range.
AcceptOutcome accept(const AcceptInput& in);

// log_softmax of a raw logits row: log sum exp through fixed point, and the n most likely tokens
// (logit desc, id asc).
double raw_log_normaliser(std::span<const float> logits);
float raw_logprob(std::span<const float> logits, double log_normaliser, int32_t token);
std::vector<int32_t> top_logit_ids(std::span<const float> logits, int n);

}  // namespace sampling

namespace cpu {
// The CPU backend's sample op; arguments validated (validate.h validate_sample).
void sample(const SampleArgs& args);
}  // namespace cpu

}  // namespace pd
