// The exactness gates of docs/spec/speculative.md §3 on a real model: the building blocks that both
// `puredrive check` (a pass/fail table on any model and backend) and tests/exactness/ (gtest assertions on
// the fixtures) run. Each gate returns what it measured; the caller decides pass or fail and prints.
//
//   identity:        the generator's tokens with MTP cycles == its plain tokens (greedy, or seeded at any
//                    temperature), with the real MTP head or a scripted drafter (oracle / random prefix);
//   row exactness:   every row of an R-row step == the one-row step, bitwise, also after a rewind;
//   two-token fit:   the first two tokens of speculative sampling (token-wise or block, real MTP drafts at
//                    their own temperature) against the target's exact two-token law, enumerated.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "puredrive/decode/chi_square.h"
#include "puredrive/decode/generator.h"

namespace pd::gates {

enum class DraftSource { kMtp, kOracle, kRandomPrefix };
const char* draft_source_name(DraftSource s);

// Random ids in [0, limit), fixed by seed.
std::vector<int32_t> random_prompt(int32_t limit, int length, uint64_t seed);

struct IdentityCase {
  std::vector<int32_t> prompt;
  SamplingParams sampling;  // temperature 0 (greedy) or a seed (seeded)
  int num_draft = 2;
  DraftSource source = DraftSource::kMtp;
  int num_tokens = 256;
  uint64_t drafter_seed = 1;                    // kRandomPrefix
  std::optional<float> draft_temperature = {};  // kMtp drafts at their own temperature
};

struct IdentityReport {
  std::vector<int32_t> plain, speculative;
  int first_mismatch = -1;  // -1: identical
  AcceptStats stats;        // of the speculative run
  std::vector<int> cycle_accepted;
  bool identical() const { return first_mismatch < 0 && plain.size() == speculative.size(); }
  // Every cycle accepted all its drafts (kOracle's promise).
  bool all_accepted() const;
  // Every accepted length 0..k occurred (kRandomPrefix's promise).
  bool all_lengths(int k) const;
  std::string summary() const;
};

// Runs the plain reference (or takes `plain` when given: it must hold num_tokens + num_draft tokens for the
// scripted drafters) and the speculative run; EOS does not stop either.
Expected<IdentityReport> check_identity(Generator& g, const IdentityCase& c,
                                        const std::vector<int32_t>* plain = nullptr);

struct RowExactReport {
  int rows_checked = 0;  // R values
  int mismatches = 0;
  std::string first_problem;
  bool passed() const { return mismatches == 0 && rows_checked > 0; }
};

// For R = 2..max_r: an R-row step after a 3-token prefix against one-row steps (logits and hidden states,
// bitwise), then rewinds to rows 0, R/2, R-1 and continues 3 one-row steps (logits bitwise).
Expected<RowExactReport> check_row_exactness(Model& model, int max_r, uint64_t seed);

// The exact law of the next two tokens after prompt under plain sampling with `params`, by enumeration over
// the first token's support: the pairs (t1, t2) of positive probability, key t1 * V + t2, ascending.
struct TwoTokenLaw {
  int32_t vocab = 0;
  std::vector<int64_t> keys;
  std::vector<double> probs;
};
Expected<TwoTokenLaw> exact_next_two(Model& model, const std::vector<int32_t>& prompt,
                                     const SamplingParams& params);

struct FitCase {
  std::vector<int32_t> prompt;
  SamplingParams sampling;         // the target's
  float draft_temperature = 1.5f;  // the MTP drafts' (must differ from the target's: q != p)
  int num_draft = 2;
  int samples = 20000;
  uint64_t seed = 1;  // sample i uses rng seed (seed << 32) + i: the same drafts for every rule
};

struct FitReport {
  ChiSquareResult chi;
  AcceptStats first_cycle;  // the first cycle of every sample
  double seconds = 0;
};

// Draws `samples` independent speculative runs of the generator from the prompt, with the real MTP head as
// drafter and `verifier` as the rule, and fits the first two tokens to `law` (pairs outside it count as
// impossible). The prompt needs >= 2 tokens so that the first step is a cycle.
Expected<FitReport> speculative_two_token_fit(Generator& g, const FitCase& c, const Verifier& verifier,
                                              const TwoTokenLaw& law);

}  // namespace pd::gates
