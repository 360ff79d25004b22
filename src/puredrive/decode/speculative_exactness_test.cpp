// Exactness of speculative decoding on synthetic Markov models (docs/spec/speculative.md §3):
//   - chi-square: the first two tokens emitted by the speculative loop (token-wise and block
//     verification, k = 2, as many cycles as it takes) follow the exact two-token law of the target,
//     enumerated from its distributions; deliberately faulty rules are rejected by the same test;
//   - seeded identity: seeded speculative decoding emits exactly the non-speculative seeded tokens;
//   - greedy identity: greedy speculative decoding emits exactly the non-speculative greedy tokens.
#include <gtest/gtest.h>

#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "puredrive/decode/accept_stats.h"
#include "puredrive/decode/acceptance.h"
#include "puredrive/decode/chi_square.h"
#include "puredrive/decode/speculative_harness.h"
#include "puredrive/decode/synthetic_markov.h"

namespace pd {
namespace {

constexpr int kSamples = 30000;  // speculative samples per chi-square test (the spec asks >= 20,000)
constexpr double kPassP = 1e-3;
constexpr double kRejectP = 1e-6;

struct ChiSquareCase {
  std::string name;
  SyntheticMarkov target;
  SyntheticMarkov draft;
  std::vector<int32_t> prompt;
};

SamplingParams params(float temperature, float top_p = 1.0f, int top_k = 0, float min_p = 0.0f) {
  SamplingParams sp;
  sp.temperature = temperature;
  sp.top_p = top_p;
  sp.top_k = top_k;
  sp.min_p = min_p;
  return sp;
}

std::vector<ChiSquareCase> chi_square_cases() {
  std::vector<ChiSquareCase> cases;
  {
    // Full support on both sides; a draft that agrees only loosely with the target.
    SyntheticMarkov target(16, 1, 1.5, params(1.0f));
    SyntheticMarkov draft = target.perturbed(0.3, 2, 1.5, params(1.0f));
    cases.push_back({"V=16 T=1, loose draft", target, draft, {3}});
  }
  {
    // Truncated target (top-k, top-p), a hotter draft on a reduced vocabulary (top-k 6): drafts outside
    // the target's kept set and target tokens the draft cannot propose.
    SyntheticMarkov target(32, 3, 1.0, params(0.7f, 0.9f, 10));
    SyntheticMarkov draft = target.perturbed(0.6, 4, 1.0, params(1.3f, 1.0f, 6));
    cases.push_back({"V=32 T=0.7 top-p=0.9 top-k=10, draft T=1.3 top-k=6", target, draft, {5, 9}});
  }
  {
    // Penalties that depend on the drafted tokens, min-p, and a colder draft.
    SamplingParams tp = params(1.0f, 1.0f, 0, 0.02f);
    tp.presence_penalty = 0.8f;
    tp.frequency_penalty = 0.5f;
    tp.repetition_penalty = 1.3f;
    SamplingParams dp = params(0.6f);
    SyntheticMarkov target(24, 5, 1.5, tp);
    SyntheticMarkov draft = target.perturbed(0.5, 6, 1.5, dp);
    cases.push_back({"V=24 penalties + min-p, draft T=0.6", target, draft, {7, 7, 2}});
  }
  return cases;
}

// Draws kSamples speculative runs from the prompt, each until at least two tokens came out, and fits the
// first two against the exact joint law. kSeeded runs use seed i for sample i (the seed is the randomness).
ChiSquareResult speculative_two_token_fit(const ChiSquareCase& c, const Verifier& verifier, int k,
                                          uint64_t seed, AcceptStats* stats) {
  const int vocab = c.target.vocab();
  const DistributionFn target = c.target.distribution(c.prompt.size());
  const DistributionFn draft = c.draft.distribution(c.prompt.size());
  const Expected<std::vector<double>> joint = exact_two_token_joint(target, c.prompt);
  EXPECT_TRUE(joint.has_value());
  SpeculativeLoop loop{.target = target,
                       .drafter = chained_drafter(draft, verifier.rule(), 0),
                       .verifier = verifier,
                       .num_draft = k};
  std::vector<int64_t> counts(static_cast<size_t>(vocab) * vocab, 0);
  Rng rng(seed);
  for (int i = 0; i < kSamples; ++i) {
    if (verifier.rule() == AcceptRule::kSeeded) {
      loop.seed = seed + static_cast<uint64_t>(i);
      loop.drafter = chained_drafter(draft, AcceptRule::kSeeded, loop.seed);
    }
    const Expected<std::vector<int32_t>> out = generate_speculative(loop, c.prompt, 2, rng, stats);
    EXPECT_TRUE(out.has_value());
    ++counts[(*out)[0] * vocab + (*out)[1]];
  }
  return chi_square_goodness_of_fit(counts, *joint);
}

TEST(SpeculativeExactness, ChiSquareTokenwiseAndBlockFollowTheTarget) {
  for (const ChiSquareCase& c : chi_square_cases()) {
    for (AcceptRule rule : {AcceptRule::kTokenwise, AcceptRule::kBlock}) {
      AcceptStats stats;
      const ChiSquareResult r = speculative_two_token_fit(c, Verifier(rule), 2, 1234, &stats);
      std::printf("[%s] %-9s %s\n    %s\n", c.name.c_str(), accept_rule_name(rule), r.summary().c_str(),
                  stats.summary().c_str());
      EXPECT_EQ(r.impossible, 0) << c.name << " " << accept_rule_name(rule);
      EXPECT_GT(r.p_value, kPassP) << c.name << " " << accept_rule_name(rule) << ": " << r.summary();
    }
  }
}

// Longer drafts exercise every intermediate h_i of block verification (and the seeded rule's law over
// seeds); the first two emitted tokens must still follow the target.
TEST(SpeculativeExactness, ChiSquareLongerDraftsAndSeededOverSeeds) {
  const std::vector<ChiSquareCase> cases = chi_square_cases();
  struct Run {
    AcceptRule rule;
    int k;
    size_t case_index;
  };
  for (const Run run : {Run{AcceptRule::kBlock, 4, 0}, Run{AcceptRule::kTokenwise, 3, 2},
                        Run{AcceptRule::kBlock, 3, 2}, Run{AcceptRule::kSeeded, 3, 1}}) {
    const ChiSquareCase& c = cases[run.case_index];
    AcceptStats stats;
    const ChiSquareResult r = speculative_two_token_fit(c, Verifier(run.rule), run.k, 99, &stats);
    std::printf("[%s] %-9s k=%d %s\n    %s\n", c.name.c_str(), accept_rule_name(run.rule), run.k,
                r.summary().c_str(), stats.summary().c_str());
    EXPECT_EQ(r.impossible, 0);
    EXPECT_GT(r.p_value, kPassP) << c.name << " " << accept_rule_name(run.rule) << " k=" << run.k;
  }
}

TEST(SpeculativeExactness, ChiSquareRejectsFaultyRules) {
  using testonly::FaultyRule;
  const std::vector<ChiSquareCase> cases = chi_square_cases();
  const ChiSquareCase& c = cases[0];
  for (FaultyRule rule :
       {FaultyRule::kBlockUncapped, FaultyRule::kBlockFirstFailure, FaultyRule::kTokenwiseResampleTarget}) {
    const Verifier verifier = testonly::faulty_verifier(rule);
    ASSERT_TRUE(verifier.is_faulty());
    AcceptStats stats;
    const ChiSquareResult r = speculative_two_token_fit(c, verifier, 2, 1234, &stats);
    std::printf("[%s] %-32s %s\n    %s\n", c.name.c_str(), verifier.name(), r.summary().c_str(),
                stats.summary().c_str());
    EXPECT_LT(r.p_value, kRejectP) << verifier.name() << ": " << r.summary();
  }
}

// The token-wise rule with an uncapped ratio is the same rule (r <= 1), so the "uncapped" fault lives in
// block verification; this checks the premise that a faulty verifier still drafts like the real rule.
TEST(SpeculativeExactness, FaultyVerifiersImitateTheirRule) {
  EXPECT_EQ(testonly::faulty_verifier(testonly::FaultyRule::kBlockUncapped).rule(), AcceptRule::kBlock);
  EXPECT_EQ(testonly::faulty_verifier(testonly::FaultyRule::kBlockFirstFailure).rule(), AcceptRule::kBlock);
  EXPECT_EQ(testonly::faulty_verifier(testonly::FaultyRule::kTokenwiseResampleTarget).rule(),
            AcceptRule::kTokenwise);
  EXPECT_FALSE(Verifier(AcceptRule::kBlock).is_faulty());
}

TEST(SpeculativeExactness, SeededSpeculationEmitsTheNonSpeculativeSeededTokens) {
  constexpr int kTokens = 256;
  const std::vector<int32_t> prompt = {1, 4, 1};
  for (float temperature : {0.7f, 1.0f}) {
    const SyntheticMarkov target(40, 11, 2.0, params(temperature, 0.9f));
    // Drafts: the target itself (every draft must be accepted), a related model at its own temperature,
    // an unrelated model, and a reduced-vocabulary draft.
    struct Draft {
      std::string name;
      SyntheticMarkov model;
    };
    const std::vector<Draft> drafts = {
        {"self", target},
        {"related T=0.5", target.perturbed(0.8, 12, 2.0, params(0.5f))},
        {"unrelated", SyntheticMarkov(40, 13, 2.0, params(1.0f))},
        {"top-k=3", target.perturbed(0.9, 14, 2.0, params(temperature, 1.0f, 3))},
    };
    for (uint64_t seed : {7u, 8u, 9u}) {
      Rng unused(0);
      const Expected<std::vector<int32_t>> plain = generate_plain(
          target.distribution(prompt.size()), AcceptRule::kSeeded, seed, prompt, kTokens, unused);
      ASSERT_TRUE(plain.has_value());
      for (const Draft& d : drafts) {
        for (int k = 1; k <= 4; ++k) {
          const SpeculativeLoop loop{
              .target = target.distribution(prompt.size()),
              .drafter = chained_drafter(d.model.distribution(prompt.size()), AcceptRule::kSeeded, seed),
              .verifier = Verifier(AcceptRule::kSeeded),
              .num_draft = k,
              .seed = seed};
          AcceptStats stats;
          Rng rng(seed);
          Expected<std::vector<int32_t>> spec = generate_speculative(loop, prompt, kTokens, rng, &stats);
          ASSERT_TRUE(spec.has_value());
          spec->resize(kTokens);
          ASSERT_EQ(*spec, *plain) << "T=" << temperature << " seed=" << seed << " draft=" << d.name
                                   << " k=" << k;
          if (d.name == "self") {
            ASSERT_EQ(stats.accepted, stats.drafted) << "a draft equal to the target";
          }
          if (seed == 7 && k == 3) {
            std::printf("seeded T=%.1f draft=%-13s k=3: %s\n", temperature, d.name.c_str(),
                        stats.summary().c_str());
          }
        }
      }
    }
  }
}

// Drafters that ignore distributions, for the greedy rule.
DrafterFn oracle_drafter(const DistributionFn& target) {
  return [target](std::span<const int32_t> context, int k, Rng&, DraftProposal* out) -> Status {
    std::vector<int32_t> ctx(context.begin(), context.end());
    TokenDistribution d;
    out->tokens.clear();
    out->dists.clear();
    for (int j = 0; j < k; ++j) {
      PD_TRY(target(ctx, &d));
      out->tokens.push_back(d.argmax);
      ctx.push_back(d.argmax);
    }
    return Status::ok();
  };
}

// Right for a random number m in [0, k] of tokens, then wrong at position m.
DrafterFn right_then_wrong_drafter(const DistributionFn& target, int vocab) {
  return [target, vocab](std::span<const int32_t> context, int k, Rng& rng, DraftProposal* out) -> Status {
    PD_TRY(oracle_drafter(target)(context, k, rng, out));
    const int m = static_cast<int>(rng.uniform() * (k + 1));
    if (m < k) {
      const int shift = 1 + static_cast<int>(rng.uniform() * (vocab - 1));
      out->tokens[m] = (out->tokens[m] + shift) % vocab;
    }
    return Status::ok();
  };
}

TEST(SpeculativeExactness, GreedySpeculationEmitsTheNonSpeculativeGreedyTokens) {
  constexpr int kTokens = 256;
  const std::vector<int32_t> prompt = {2, 3};
  // Repetition and presence penalties keep the greedy chain from settling into a short cycle.
  SamplingParams tp = params(0.0f);
  tp.repetition_penalty = 1.1f;
  tp.presence_penalty = 0.2f;
  const SyntheticMarkov target(32, 21, 2.0, tp);
  const DistributionFn target_fn = target.distribution(prompt.size());
  const SyntheticMarkov other(32, 22, 2.0, params(0.0f));
  Rng unused(0);
  const Expected<std::vector<int32_t>> plain =
      generate_plain(target_fn, AcceptRule::kGreedy, 0, prompt, kTokens, unused);
  ASSERT_TRUE(plain.has_value());
  struct Named {
    std::string name;
    DrafterFn drafter;
  };
  const std::vector<Named> drafters = {
      {"oracle", oracle_drafter(target_fn)},
      {"right-then-wrong", right_then_wrong_drafter(target_fn, 32)},
      {"other model", chained_drafter(other.distribution(prompt.size()), AcceptRule::kGreedy, 0)},
  };
  for (const Named& d : drafters) {
    for (int k = 1; k <= 4; ++k) {
      const SpeculativeLoop loop{.target = target_fn,
                                 .drafter = d.drafter,
                                 .verifier = Verifier(AcceptRule::kGreedy),
                                 .num_draft = k};
      AcceptStats stats;
      Rng rng(k);
      Expected<std::vector<int32_t>> spec = generate_speculative(loop, prompt, kTokens, rng, &stats);
      ASSERT_TRUE(spec.has_value());
      spec->resize(kTokens);
      ASSERT_EQ(*spec, *plain) << d.name << " k=" << k;
      if (d.name == "oracle") {
        EXPECT_EQ(stats.accepted, stats.drafted);
      }
      if (d.name == "right-then-wrong") {
        for (int a = 0; a <= k; ++a) EXPECT_GT(stats.length_hist[a], 0) << "no cycle accepted exactly " << a;
      }
      if (k == 4) std::printf("greedy draft=%-16s k=4: %s\n", d.name.c_str(), stats.summary().c_str());
    }
  }
}

}  // namespace
}  // namespace pd
