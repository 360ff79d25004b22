// Acceptance rules on hand-made cycles, the block verification paper's worked example, and the
// "block verification accepts at least as much as token-wise" property on synthetic models.
#include "puredrive/decode/acceptance.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "puredrive/decode/accept_stats.h"
#include "puredrive/decode/speculative_harness.h"
#include "puredrive/decode/synthetic_markov.h"

namespace pd {
namespace {

TokenDistribution dist(std::vector<double> w) {
  return distribution_from_weights(w);
}

TEST(Acceptance, ChooseRuleFollowsTheParams) {
  SamplingParams sp;
  EXPECT_EQ(choose_accept_rule(sp), AcceptRule::kBlock);
  EXPECT_EQ(choose_accept_rule(sp, /*block_verification=*/false), AcceptRule::kTokenwise);
  sp.seed = 3;
  EXPECT_EQ(choose_accept_rule(sp), AcceptRule::kSeeded);
  sp.temperature = 0.0f;
  EXPECT_EQ(choose_accept_rule(sp), AcceptRule::kGreedy);
}

TEST(Acceptance, GreedyAcceptsTheMatchingPrefix) {
  // argmax: p_0 -> 2, p_1 -> 0, p_2 -> 1 (tie between 1 and 3 goes to 1).
  const std::vector<TokenDistribution> target = {dist({1, 2, 5, 1}), dist({4, 1, 1, 1}), dist({1, 3, 1, 3})};
  Rng rng(1);
  const std::vector<int32_t> both_right = {2, 0};
  AcceptResult r = accept(AcceptRule::kGreedy, {.drafts = both_right, .target = target}, rng);
  EXPECT_EQ(r.num_accepted, 2);
  EXPECT_EQ(r.next_token, 1);
  const std::vector<int32_t> second_wrong = {2, 3};
  r = accept(AcceptRule::kGreedy, {.drafts = second_wrong, .target = target}, rng);
  EXPECT_EQ(r.num_accepted, 1);
  EXPECT_EQ(r.next_token, 0);
  const std::vector<int32_t> first_wrong = {1, 0};
  r = accept(AcceptRule::kGreedy, {.drafts = first_wrong, .target = target}, rng);
  EXPECT_EQ(r.num_accepted, 0);
  EXPECT_EQ(r.next_token, 2);
}

TEST(Acceptance, SeededVerifyEqualsTheTargetsOwnSeededDraws) {
  const std::vector<TokenDistribution> target = {dist({1, 2, 5, 1}), dist({4, 1, 1, 1}), dist({1, 3, 1, 3})};
  Rng rng(1);
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const int64_t pos = 100 + static_cast<int64_t>(seed);
    const int32_t t0 = sample_seeded(target[0], seed, pos);
    const int32_t t1 = sample_seeded(target[1], seed, pos + 1);
    const int32_t t2 = sample_seeded(target[2], seed, pos + 2);
    const std::vector<int32_t> right = {t0, t1};
    AcceptResult r = accept(AcceptRule::kSeeded,
                            {.drafts = right, .target = target, .seed = seed, .first_position = pos}, rng);
    EXPECT_EQ(r.num_accepted, 2);
    EXPECT_EQ(r.next_token, t2);
    const std::vector<int32_t> wrong = {t0, (t1 + 1) % 4};
    r = accept(AcceptRule::kSeeded, {.drafts = wrong, .target = target, .seed = seed, .first_position = pos},
               rng);
    EXPECT_EQ(r.num_accepted, 1);
    EXPECT_EQ(r.next_token, t1);
  }
}

TEST(Acceptance, IdenticalDraftIsAlwaysFullyAccepted) {
  const std::vector<TokenDistribution> target = {dist({1, 2, 5, 1}), dist({4, 1, 1, 1}), dist({1, 3, 1, 3})};
  const std::vector<TokenDistribution> draft = {target[0], target[1]};
  Rng rng(3);
  for (AcceptRule rule : {AcceptRule::kTokenwise, AcceptRule::kBlock}) {
    for (int i = 0; i < 2000; ++i) {
      const std::vector<int32_t> d = {sample(draft[0], rng), sample(draft[1], rng)};
      const AcceptResult r = accept(rule, {.drafts = d, .target = target, .draft = draft}, rng);
      ASSERT_EQ(r.num_accepted, 2) << accept_rule_name(rule);
    }
  }
}

TEST(Acceptance, TokensTheTargetMasksAreNeverAccepted) {
  // The target masks token 0 (p = 0); the draft proposes it with high probability.
  const std::vector<TokenDistribution> target = {dist({0, 1, 1}), dist({0, 1, 1}), dist({0, 1, 1})};
  const std::vector<TokenDistribution> draft = {dist({8, 1, 1}), dist({8, 1, 1})};
  Rng rng(4);
  for (AcceptRule rule : {AcceptRule::kTokenwise, AcceptRule::kBlock}) {
    for (int i = 0; i < 2000; ++i) {
      const std::vector<int32_t> d = {0, sample(draft[1], rng)};
      const AcceptResult r = accept(rule, {.drafts = d, .target = target, .draft = draft}, rng);
      ASSERT_EQ(r.num_accepted, 0) << accept_rule_name(rule);
      ASSERT_NE(r.next_token, 0) << accept_rule_name(rule);
    }
  }
}

// Sun et al. 2025, Section 3 example: context-free target p = (1/3, 2/3), draft q = (2/3, 1/3), draft
// length 2. Token-wise verification accepts 10/9 tokens per iteration on average, block verification 11/9.
TEST(Acceptance, BlockVerificationPaperExample) {
  const TokenDistribution p = dist({1, 2});
  const TokenDistribution q = dist({2, 1});
  const std::vector<TokenDistribution> target = {p, p, p};
  const std::vector<TokenDistribution> draft = {q, q};
  constexpr int kCycles = 200000;
  for (AcceptRule rule : {AcceptRule::kTokenwise, AcceptRule::kBlock}) {
    Rng rng(11);
    AcceptStats stats;
    for (int i = 0; i < kCycles; ++i) {
      const std::vector<int32_t> d = {sample(q, rng), sample(q, rng)};
      stats.record(2, accept(rule, {.drafts = d, .target = target, .draft = draft}, rng).num_accepted);
    }
    const double expected = rule == AcceptRule::kBlock ? 11.0 / 9.0 : 10.0 / 9.0;
    // sd of the accepted count is < 1, so 5 standard errors < 5 / sqrt(kCycles) ~ 0.011.
    std::printf("paper example %s: mean accepted %.4f (paper %.4f) %s\n", accept_rule_name(rule),
                stats.mean_accepted(), expected, stats.summary().c_str());
    EXPECT_NEAR(stats.mean_accepted(), expected, 5.0 / std::sqrt(kCycles));
  }
}

// The same drafts and target rows verified by both rules: block verification must accept at least as many
// tokens on average (it is optimal among valid verifiers, Sun et al. Theorem 2).
TEST(Acceptance, BlockAcceptsAtLeastAsManyAsTokenwiseOnTheSameDrafts) {
  struct Case {
    int vocab;
    double mix;
    int k;
  };
  for (const Case c : {Case{16, 0.3, 2}, Case{32, 0.7, 3}, Case{48, 0.9, 4}}) {
    SamplingParams tp;
    tp.temperature = 0.9f;
    const SyntheticMarkov target(c.vocab, 100 + c.vocab, 2.0, tp);
    SamplingParams dp;
    dp.temperature = 1.1f;
    const SyntheticMarkov draft = target.perturbed(c.mix, 200 + c.vocab, 2.0, dp);
    const DistributionFn target_fn = target.distribution(1);
    const DrafterFn drafter = chained_drafter(draft.distribution(1), AcceptRule::kBlock, 0);
    Rng draft_rng(1), rng_tokenwise(2), rng_block(3);
    AcceptStats tokenwise, block;
    double sum_diff = 0, sum_diff2 = 0;
    constexpr int kCycles = 20000;
    DraftProposal drafts;
    std::vector<TokenDistribution> rows(c.k + 1);
    for (int i = 0; i < kCycles; ++i) {
      std::vector<int32_t> ctx = {static_cast<int32_t>(i % c.vocab)};
      ASSERT_TRUE(drafter(ctx, c.k, draft_rng, &drafts).is_ok());
      for (int j = 0; j <= c.k; ++j) {
        ASSERT_TRUE(target_fn(ctx, &rows[j]).is_ok());
        if (j < c.k) ctx.push_back(drafts.tokens[j]);
      }
      const VerifyInput in{.drafts = drafts.tokens, .target = rows, .draft = drafts.dists};
      const int a = accept(AcceptRule::kTokenwise, in, rng_tokenwise).num_accepted;
      const int b = accept(AcceptRule::kBlock, in, rng_block).num_accepted;
      tokenwise.record(c.k, a);
      block.record(c.k, b);
      sum_diff += b - a;
      sum_diff2 += static_cast<double>(b - a) * (b - a);
    }
    const double mean = sum_diff / kCycles;
    const double se = std::sqrt((sum_diff2 / kCycles - mean * mean) / kCycles);
    std::printf("V=%d mix=%.1f k=%d\n  tokenwise: %s\n  block:     %s\n  block - tokenwise = %.4f +- %.4f\n",
                c.vocab, c.mix, c.k, tokenwise.summary().c_str(), block.summary().c_str(), mean, se);
    EXPECT_GT(mean, -3.0 * se);
    EXPECT_GE(block.tokens_per_cycle() + 3.0 * se, tokenwise.tokens_per_cycle());
  }
}

TEST(AcceptStats, RecordsPerPositionAndMerges) {
  AcceptStats s;
  s.record(3, 3);
  s.record(3, 1);
  s.record(2, 0);
  EXPECT_EQ(s.cycles, 3);
  EXPECT_EQ(s.drafted, 8);
  EXPECT_EQ(s.accepted, 4);
  EXPECT_EQ(s.emitted(), 7);
  EXPECT_DOUBLE_EQ(s.tokens_per_cycle(), 7.0 / 3.0);
  EXPECT_DOUBLE_EQ(s.acceptance_rate_at(0), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(s.acceptance_rate_at(2), 1.0 / 2.0);
  EXPECT_EQ(s.length_hist, (std::vector<int64_t>{1, 1, 0, 1}));
  AcceptStats t;
  t.record(4, 4);
  s.merge(t);
  EXPECT_EQ(s.cycles, 4);
  EXPECT_EQ(s.proposed_at, (std::vector<int64_t>{4, 4, 3, 1}));
  EXPECT_EQ(s.accepted_at, (std::vector<int64_t>{3, 2, 2, 1}));
}

}  // namespace
}  // namespace pd
