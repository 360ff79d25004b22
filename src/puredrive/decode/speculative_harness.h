// The speculative cycle (draft, verify, accept) on distribution callbacks, with no model state: the
// reference that the exactness tests sample from. A DistributionFn is a target or draft "model" reduced
// to what acceptance sees, the processed next-token distribution after a context; synthetic Markov models
// in the unit tests and the real engine (run the context, process_logits the last row) in `puredrive
// check` both plug in here. The real generator (prefill, MTP draft, verify, rollback) must emit the same
// tokens as this loop for the same distributions and random draws.
//
// Positions: the token appended to a context of length L has absolute position L (seeded mode noise).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "puredrive/decode/accept_stats.h"
#include "puredrive/decode/acceptance.h"
#include "puredrive/decode/sampler.h"
#include "puredrive/util/status.h"

namespace pd {

using DistributionFn = std::function<Status(std::span<const int32_t> context, TokenDistribution* out)>;

// What a drafter proposes here: the drafts and the distributions they were drawn from (kGreedy / kSeeded
// drafters may leave dists empty).
struct DraftProposal {
  std::vector<int32_t> tokens;           // d_1..d_k
  std::vector<TokenDistribution> dists;  // q_1..q_k
};

// Proposes k tokens after `context`.
using DrafterFn =
    std::function<Status(std::span<const int32_t> context, int k, Rng& rng, DraftProposal* out)>;

// The usual drafter: chains `draft` on its own proposals and picks each d_j with
// draw_token(rule, q_j, rng, seed, context.size() + j - 1), as the MTP head does.
DrafterFn chained_drafter(DistributionFn draft, AcceptRule rule, uint64_t seed);

// Non-speculative reference: num_tokens tokens, each draw_token(rule, p(. | context), rng, seed, position).
Expected<std::vector<int32_t>> generate_plain(const DistributionFn& target, AcceptRule rule, uint64_t seed,
                                              std::span<const int32_t> prompt, int num_tokens, Rng& rng);

struct SpeculativeLoop {
  DistributionFn target;
  DrafterFn drafter;
  Verifier verifier{AcceptRule::kBlock};
  int num_draft = 2;  // k
  uint64_t seed = 0;  // kSeeded
};

// Runs cycles until at least num_tokens new tokens were emitted and returns all of them (up to
// num_tokens + k). Cycle accounting goes to stats when given.
Expected<std::vector<int32_t>> generate_speculative(const SpeculativeLoop& loop,
                                                    std::span<const int32_t> prompt, int num_tokens, Rng& rng,
                                                    AcceptStats* stats = nullptr);

// Exact joint law of the next two tokens after prompt under target: joint[t1 * V + t2] = p(t1) p(t2 | t1).
Expected<std::vector<double>> exact_two_token_joint(const DistributionFn& target,
                                                    std::span<const int32_t> prompt);

}  // namespace pd
