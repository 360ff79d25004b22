// Distribution exactness of speculative sampling through the real engine (docs/spec/speculative.md §3), on
// the small-vocabulary fixture (V = 48): the first two tokens that the generator emits with MTP cycles (k =
// 2, the real MTP head drafting at its own temperature, so q != p; each sample a fresh run from the prompt)
// follow the target's exact two-token law,
// enumerated from plain forward passes. Token-wise and block verification must pass (p > 0.001); the same
// harness must reject deliberately wrong rules (p < 1e-6), which shows it has the power to see a mistake.
// Block verification must accept at least as many drafts per cycle as token-wise on the same drafts (the
// first cycle of sample i drafts with the same random stream under both rules).
#include <fmt/format.h>

#include <cstdio>

#include "exactness/generator_test_util.h"

namespace pd::exactness {
namespace {

const int kSamples = full_or(20000, 1500);
constexpr double kPassP = 1e-3;
constexpr double kRejectP = 1e-6;
constexpr const char* kFixture = "qwen35-smallvocab-f32";

struct ChiSquareEngine : ::testing::Test {
  static void SetUpTestSuite() {
    g_ = GeneratorFixture::open(kFixture, 64).release();
    ASSERT_NE(g_, nullptr);
    // Two prompt tokens keep a sample cheap (one prefill row); the first cycle drafts after the second.
    const std::vector<int32_t> p1 = g_->prompts()[1];
    fit_.prompt.assign(p1.end() - 2, p1.end());
    // A hot target and much hotter drafts: the drafts overlap the target enough that about one in two is
    // accepted, which is where wrong rules show (at low acceptance every rule mostly emits the residual).
    fit_.sampling.temperature = 2.0f;
    fit_.draft_temperature = 20.0f;
    fit_.num_draft = 2;
    fit_.samples = kSamples;
    fit_.seed = 20250;
    Expected<gates::TwoTokenLaw> law = gates::exact_next_two(*g_->fx->model, fit_.prompt, fit_.sampling);
    ASSERT_TRUE(law.has_value()) << law.status().to_string();
    law_ = std::move(*law);
    std::printf("exact two-token law: %zu pairs of positive probability\n", law_.keys.size());
  }
  static void TearDownTestSuite() {
    delete g_;
    g_ = nullptr;
  }

  static gates::FitReport fit(const Verifier& v) {
    Expected<gates::FitReport> r = gates::speculative_two_token_fit(*g_->gen, fit_, v, law_);
    EXPECT_TRUE(r.has_value()) << r.status().to_string();
    if (!r) return {};
    std::printf("%-28s %s\n    first cycle: %s (%.1f s)\n", v.name(), r->chi.summary().c_str(),
                r->first_cycle.summary().c_str(), r->seconds);
    return *r;
  }

  static GeneratorFixture* g_;
  static gates::FitCase fit_;
  static gates::TwoTokenLaw law_;
};
GeneratorFixture* ChiSquareEngine::g_ = nullptr;
gates::FitCase ChiSquareEngine::fit_;
gates::TwoTokenLaw ChiSquareEngine::law_;

TEST_F(ChiSquareEngine, TokenwiseAndBlockFollowTheTargetAndBlockAcceptsMore) {
  const gates::FitReport token = fit(Verifier(AcceptRule::kTokenwise));
  const gates::FitReport block = fit(Verifier(AcceptRule::kBlock));
  for (const gates::FitReport* r : {&token, &block}) {
    EXPECT_EQ(r->chi.samples, kSamples);
    EXPECT_EQ(r->chi.impossible, 0);
    EXPECT_GT(r->chi.p_value, kPassP) << r->chi.summary();
  }
  // q != p: the drafts are not always accepted, and not always rejected.
  EXPECT_GT(token.first_cycle.accepted, 0);
  EXPECT_LT(token.first_cycle.accepted, token.first_cycle.drafted);
  std::printf("mean accepted drafts in the first cycle: token-wise %.4f, block %.4f (%+.4f)\n",
              token.first_cycle.mean_accepted(), block.first_cycle.mean_accepted(),
              block.first_cycle.mean_accepted() - token.first_cycle.mean_accepted());
  EXPECT_GE(block.first_cycle.mean_accepted(), token.first_cycle.mean_accepted());
}

TEST_F(ChiSquareEngine, WrongRulesAreRejected) {
  if (!kFullSize) GTEST_SKIP() << "rejecting at p < 1e-6 needs the full 20,000 samples (optimized build)";
  using testonly::FaultyRule;
  // (The token-wise rule that resamples the target after a rejection is rejected by the synthetic tests of
  // decode/speculative_exactness_test.cpp; the two block faults are the subtle ones.)
  for (FaultyRule rule : {FaultyRule::kBlockUncapped, FaultyRule::kBlockFirstFailure}) {
    const gates::FitReport r = fit(testonly::faulty_verifier(rule));
    EXPECT_LT(r.chi.p_value, kRejectP) << testonly::faulty_rule_name(rule) << ": " << r.chi.summary();
  }
}

}  // namespace
}  // namespace pd::exactness
