// DraftPolicy (draft_policy.h) with acceptances and step times fed in, so every choice is determined.
#include "puredrive/decode/draft_policy.h"

#include <gtest/gtest.h>

namespace pd {
namespace {

// Runs the exploration every request starts with: two full cycles (accepting `accepted` drafts each), then
// two plain steps.
void explore(DraftPolicy& p, int max_draft, int accepted, double cycle_s, double plain_s) {
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(p.next(), max_draft) << "cycle " << i;
    p.record_cycle(max_draft, accepted, cycle_s);
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(p.next(), 0) << "plain step " << i;
    p.record_plain(plain_s);
  }
}

TEST(DraftPolicy, ExpectedTokensFollowTheAcceptanceChances) {
  DraftPolicy p(3);
  // The prior alone: 0.8 per draft.
  EXPECT_DOUBLE_EQ(p.accept_chance(1), 0.8);
  EXPECT_DOUBLE_EQ(p.expected_tokens(0), 1.0);
  EXPECT_NEAR(p.expected_tokens(3), 1.0 + 0.8 + 0.64 + 0.512, 1e-12);
  // A cycle that kept one draft of three: draft 1 accepted, draft 2 judged and rejected, draft 3 not judged.
  p.record_cycle(3, 1, 1.0);
  EXPECT_NEAR(p.accept_chance(1), (0.9 * 1.6 + 1.0) / (0.9 * 2.0 + 1.0), 1e-12);
  EXPECT_NEAR(p.accept_chance(2), (0.9 * 1.6) / (0.9 * 2.0 + 1.0), 1e-12);
  EXPECT_NEAR(p.accept_chance(3), 0.8, 1e-12);
}

TEST(DraftPolicy, KeepsDraftingWhenCyclesPayAndRetimesThePlainStep) {
  DraftPolicy p(2);
  explore(p, 2, 2, 1.3, 1.0);  // 3 tokens for 1.3 steps
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < DraftPolicy::kRetimeEvery; ++i) {
      ASSERT_EQ(p.next(), 2) << "round " << round << " cycle " << i;
      p.record_cycle(2, 2, 1.3);
    }
    ASSERT_EQ(p.next(), 0) << "retiming " << round;
    p.record_plain(1.0);
  }
}

TEST(DraftPolicy, DecodesPlainlyWhenDraftsAreRejectedAndProbesLessAndLess) {
  DraftPolicy p(2);
  explore(p, 2, 0, 2.5, 1.0);  // the tiny coder on the CPU: a 3-row verify costs 2.5 plain steps
  // The exploration's two plain steps count towards the first probe; each failed probe doubles the wait.
  const int waits[] = {DraftPolicy::kProbeEvery - 2, 32, 64, 128, 256, 256};
  for (int round = 0; round < 6; ++round) {
    for (int i = 0; i < waits[round]; ++i) {
      ASSERT_EQ(p.next(), 0) << "round " << round << " step " << i;
      p.record_plain(1.0);
    }
    ASSERT_EQ(p.next(), 2) << "probe " << round;
    p.record_cycle(2, 0, 2.5);
  }
}

TEST(DraftPolicy, AProbeThatPaysBringsDraftingBack) {
  DraftPolicy p(1);
  explore(p, 1, 0, 1.5, 1.0);  // rejected drafts: 1.37 tokens for 1.5 steps
  for (int i = 0; i < DraftPolicy::kProbeEvery - 2; ++i) {
    ASSERT_EQ(p.next(), 0) << "step " << i;
    p.record_plain(1.0);
  }
  ASSERT_EQ(p.next(), 1);  // the probe keeps its draft: 1.52 tokens for 1.5 steps
  p.record_cycle(1, 1, 1.5);
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(p.next(), 1) << "cycle " << i;
    p.record_cycle(1, 1, 1.5);
  }
  EXPECT_GT(p.accept_chance(1), 0.9);
}

TEST(DraftPolicy, PicksTheDraftLengthWithTheMostTokensPerSecond) {
  DraftPolicy p(2);
  // Draft 1 always kept, draft 2 never: two tokens for a one-draft cycle, no more for two drafts.
  explore(p, 2, 1, 1.6, 1.0);
  for (int i = 0; i < 10; ++i) p.record_cycle(2, 1, 1.6);
  EXPECT_GT(p.accept_chance(1), 0.98);
  EXPECT_LT(p.accept_chance(2), 0.1);
  // A one-draft cycle untimed yet: interpolated at 1.3 steps, 2 / 1.3 beats 1 / 1 and 2.04 / 1.6.
  EXPECT_EQ(p.next(), 1);
  p.record_cycle(1, 1, 1.3);
  p.record_cycle(1, 1, 1.3);
  EXPECT_EQ(p.next(), 1);
  // Both cycles measured dearer than the tokens they bring: back to plain steps.
  for (int i = 0; i < 20; ++i) {
    p.record_cycle(1, 1, 2.2);
    p.record_cycle(2, 1, 2.5);
  }
  p.record_plain(1.0);  // (so that the choice is not the retiming step)
  EXPECT_EQ(p.next(), 0);
  p.record_plain(1.0);
  EXPECT_EQ(p.next(), 0);
}

TEST(DraftPolicy, LeavesOutEachFirstTime) {
  DraftPolicy p(1);
  // The first cycle and the first plain step record graphs on the GPU: 100 x slower, ignored.
  p.record_cycle(1, 1, 100.0);
  p.record_cycle(1, 1, 1.2);
  p.record_plain(100.0);
  p.record_plain(1.0);
  EXPECT_EQ(p.next(), 1);  // 1.8+ tokens for 1.2 steps
}

TEST(DraftPolicy, LeavesOutLoneSlowStepsNotARunOfThem) {
  DraftPolicy p(1);
  explore(p, 1, 1, 1.2, 1.0);  // 1.8+ tokens for 1.2 steps
  // A cycle that recorded a graph: left out.
  p.record_cycle(1, 1, 50.0);
  EXPECT_EQ(p.next(), 1);
  p.record_cycle(1, 1, 1.2);
  // Then the machine gets slower: the third slow cycle in a row counts, and the average follows.
  for (int i = 0; i < DraftPolicy::kOutlierRun - 1; ++i) {
    p.record_cycle(1, 1, 5.0);
    EXPECT_EQ(p.next(), 1) << "slow cycle " << i;
  }
  for (int i = 0; i < 5; ++i) p.record_cycle(1, 1, 5.0);
  EXPECT_EQ(p.next(), 0);
}

TEST(DraftPolicy, ATimeUnderHalfTheAverageReplacesIt) {
  DraftPolicy p(1);
  explore(p, 1, 1, 5.0, 1.0);  // the second cycle recorded a graph too: 1.9 tokens for 5 steps
  for (int i = 0; i < DraftPolicy::kProbeEvery - 2; ++i) {
    ASSERT_EQ(p.next(), 0) << "step " << i;
    p.record_plain(1.0);
  }
  ASSERT_EQ(p.next(), 1);  // the probe takes 1.2 steps: drafting pays
  p.record_cycle(1, 1, 1.2);
  EXPECT_EQ(p.next(), 1);
}

TEST(DraftPolicy, NoDraftsWithoutADraftLength) {
  DraftPolicy p(0);
  EXPECT_EQ(p.next(), 0);
  p.record_plain(1.0);
  EXPECT_EQ(p.next(), 0);
}

}  // namespace
}  // namespace pd
