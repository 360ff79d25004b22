// Acceptance rules of speculative decoding (docs/spec/speculative.md §2), on processed distributions.
//
// One cycle: the drafter proposed d_1..d_k, drawing d_j from q_j (conditioned on d_1..d_{j-1}); the target
// verified the rows [x_n, d_1, .., d_k] and process_logits() turned each row into p_0..p_k (p_j is the
// next-token distribution after d_1..d_j, with the penalties of that row's history). A rule returns the
// number a of accepted drafts and one more token y (the correction when a < k, the bonus when a == k);
// the generator commits d_1..d_a, y.
//
//   kGreedy    accept d_j while d_j == argmax p_{j-1}; y = argmax p_a (ties to the lowest id).
//   kTokenwise Leviathan et al. 2023 / Chen et al. 2023: accept d_j with prob min(1, p_{j-1}(d_j)/q_j(d_j));
//              at the first rejection y ~ norm(max(0, p_{j-1} - q_j)); y ~ p_k when all are accepted.
//   kBlock     Sun et al., "Block Verification Accelerates Speculative Decoding", ICLR 2025
//              (arXiv 2403.10444), Algorithm 2: P_0 = 1, P_i = min(1, P_{i-1} p_{i-1}(d_i)/q_i(d_i));
//              h_i = Z_i / (Z_i + 1 - P_i) with Z_i = sum_x max(0, P_i p_i(x) - q_{i+1}(x)) for i < k and
//              h_k = P_k; tau = the LARGEST i with eta_i <= h_i (no early stop); y ~ p_k if tau = k, else
//              y ~ norm(max(0, P_tau p_tau - q_{tau+1})). Never accepts fewer tokens on average than
//              kTokenwise.
//   kSeeded    accept d_j while d_j == the target's own Gumbel argmax at d_j's position; y = the target's
//              Gumbel argmax at position first_position + a. Emits exactly the tokens of the
//              non-speculative seeded sampler (sample_seeded) for any drafter.
//
// kTokenwise and kBlock are exact for any q as long as d_j really was drawn from q_j: draft temperature,
// truncation or a reduced draft vocabulary (q = 0 outside it) only change acceptance. A draft with
// q_j(d_j) = 0 is a programmer error (PD_ASSERT).
//
// The rules themselves are backend/cpu/sampling.h's accept(), which the backends' sample op reproduces on
// the device; this header is their host interface over TokenDistributions and an Rng.
//
// Tests: acceptance_test.cpp (hand-made cycles, the paper's worked example, block >= token-wise) and
// speculative_exactness_test.cpp (chi-square goodness of fit, faulty rules rejected, seeded and greedy
// identity).
#pragma once

#include <cstdint>
#include <span>

#include "puredrive/decode/sampler.h"
#include "puredrive/decode/sampling_params.h"
#include "puredrive/decode/seeded_noise.h"

namespace pd {

// The values of backend.h SampleRule.
enum class AcceptRule : int32_t { kGreedy = 0, kTokenwise = 1, kBlock = 2, kSeeded = 3 };

inline SampleRule sample_rule(AcceptRule rule) {
  return static_cast<SampleRule>(static_cast<int32_t>(rule));
}

const char* accept_rule_name(AcceptRule rule);

// The rule of a request: kGreedy at temperature 0, kSeeded when a seed is set (so MTP on == off for that
// seed), otherwise kBlock, or kTokenwise when block verification is turned off.
AcceptRule choose_accept_rule(const SamplingParams& params, bool block_verification = true);

// How a token is picked from a distribution under `rule`, by the non-speculative sampler and by the
// drafter alike: kGreedy -> dist.argmax; kSeeded -> sample_seeded(dist, seed, position);
// kTokenwise / kBlock -> sample(dist, rng). `position` is the absolute position of the token drawn.
int32_t draw_token(AcceptRule rule, const TokenDistribution& dist, Rng& rng, uint64_t seed, int64_t position);

struct VerifyInput {
  std::span<const int32_t> drafts = {};            // d_1..d_k
  std::span<const TokenDistribution> target = {};  // p_0..p_k (k + 1)
  std::span<const TokenDistribution> draft = {};   // q_1..q_k (k); may be empty for kGreedy and kSeeded
  uint64_t seed = 0;                               // kSeeded
  int64_t first_position = 0;                      // absolute position of d_1 (kSeeded)
};

struct AcceptResult {
  int num_accepted = 0;     // a: d_1..d_a are committed
  int32_t next_token = -1;  // y, committed after them
};

class Verifier;

// Deliberately WRONG rules, for proving that the exactness tests (chi-square in the unit tests and in
// `puredrive check`) have power. Reachable only through this namespace, never from SamplingParams.
namespace testonly {

enum class FaultyRule : int {
  // Block verification with P_i = P_{i-1} p/q not capped at 1 ("accept with p/q uncapped"). In the
  // token-wise rule capping is a no-op (r <= 1); in block verification it changes h_i and P_tau.
  kBlockUncapped = sampling::kFaultyBlockUncapped,
  // Block verification that stops at the first i with eta_i > h_i instead of taking the largest i.
  kBlockFirstFailure = sampling::kFaultyBlockFirstFailure,
  // Token-wise with y ~ p_{j-1} instead of the residual after a rejection (a classic port bug).
  kTokenwiseResampleTarget = sampling::kFaultyTokenwiseResample,
};

const char* faulty_rule_name(FaultyRule rule);
Verifier faulty_verifier(FaultyRule rule);

}  // namespace testonly

// A rule as a value the generator holds. Faulty verifiers (testonly::faulty_verifier) report the rule they
// imitate from rule(), so a generator drafts exactly as it would for the correct rule.
class Verifier {
 public:
  explicit Verifier(AcceptRule rule) : rule_(rule) {}

  AcceptRule rule() const { return rule_; }
  bool is_faulty() const { return faulty_ != 0; }
  int32_t faulty() const { return faulty_; }  // a testonly::FaultyRule, 0 for the correct rules
  const char* name() const;

  // Uses rng only for kTokenwise / kBlock, always k + 1 uniforms, drawn first: u[j] tests d_{j+1} (unused
  // after a token-wise rejection), u[k] draws y. The fixed count lets a device draw the same numbers.
  AcceptResult accept(const VerifyInput& in, Rng& rng) const;

 private:
  friend Verifier testonly::faulty_verifier(testonly::FaultyRule rule);
  AcceptRule rule_;
  int32_t faulty_ = 0;
};

inline AcceptResult accept(AcceptRule rule, const VerifyInput& in, Rng& rng) {
  return Verifier(rule).accept(in, rng);
}

}  // namespace pd
