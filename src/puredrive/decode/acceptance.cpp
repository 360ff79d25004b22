#include "puredrive/decode/acceptance.h"

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
  const size_t k = in.drafts.size();
  std::vector<double> uniforms;
  if (rule_ == AcceptRule::kTokenwise || rule_ == AcceptRule::kBlock) {
    uniforms.resize(k + 1);
    for (double& u : uniforms) u = rng.uniform();
  }
  const sampling::AcceptOutcome r = sampling::accept({.rule = sample_rule(rule_),
                                                      .faulty = faulty_,
                                                      .drafts = in.drafts,
                                                      .target = in.target,
                                                      .draft = in.draft,
                                                      .uniforms = uniforms,
                                                      .seed = in.seed,
                                                      .first_position = in.first_position});
  PD_ASSERT(r.status == SampleStatus::kOk,
            "draft {} (token {}) has draft probability 0: it was not drawn from q_{}", r.detail + 1,
            in.drafts[static_cast<size_t>(r.detail)], r.detail + 1);
  return {.num_accepted = r.accepted, .next_token = r.next};
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
  v.faulty_ = static_cast<int32_t>(rule);
  return v;
}

}  // namespace testonly
}  // namespace pd
