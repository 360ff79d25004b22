// Greedy identity through the real generator (docs/spec/speculative.md §3, docs/DESIGN.md §4.3), on every
// fixture: the tokens of MTP cycles equal the tokens of plain decoding, for prompts of 1, 7 and 110 tokens, K
// = 1..4, 256 tokens each, with
//   - the real MTP head (random weights: mostly rejections);
//   - an oracle drafter that proposes the plain run's own future tokens: every cycle must accept all K and
//     add the bonus token;
//   - a drafter right for a random number of tokens, then wrong: every accepted length 0..K must occur, so
//     the rollback to every verify row is exercised.
// The plain run itself is anchored to transformers: its first 64 tokens are the fixture's reference greedy
// continuation. Adaptive drafting (0..K drafts a step) gives the plain tokens too, greedy and seeded.
#include <fmt/format.h>

#include "exactness/generator_test_util.h"

namespace pd::exactness {
namespace {

const int kTokens = full_or(256, 32);

class GreedyIdentity : public ::testing::TestWithParam<std::string> {};

TEST_P(GreedyIdentity, MtpCyclesEqualPlainDecoding) {
  if (skip_in_reduced_run(GetParam())) GTEST_SKIP() << "reduced (unoptimized) build";
  std::unique_ptr<GeneratorFixture> g = GeneratorFixture::open(GetParam());
  ASSERT_NE(g, nullptr);
  ASSERT_TRUE(g->gen->has_drafter()) << GetParam() << " has no MTP head";
  const std::vector<std::vector<int32_t>> prompts = g->prompts();
  ASSERT_EQ(prompts.size(), 3u);
  for (size_t pi = 0; pi < prompts.size(); ++pi) {
    const std::vector<int32_t>& prompt = prompts[pi];
    SCOPED_TRACE(fmt::format("{} prompt of {} tokens", GetParam(), prompt.size()));
    DecodeRequest plain_req;
    plain_req.prompt = prompt;
    plain_req.sampling = greedy();
    plain_req.max_tokens = kTokens + 4;
    Expected<DecodeResult> plain = g->gen->generate(plain_req);
    ASSERT_TRUE(plain.has_value()) << plain.status().to_string();
    ASSERT_EQ(plain->tokens.size(), static_cast<size_t>(kTokens + 4));
    EXPECT_EQ(plain->reason, FinishReason::kLength);
    const std::vector<int32_t> reference = g->fx->ref_ints(g->fx->prompts[pi] + ".greedy");
    const auto anchored = static_cast<ptrdiff_t>(std::min(reference.size(), plain->tokens.size()));
    EXPECT_EQ(std::vector<int32_t>(plain->tokens.begin(), plain->tokens.begin() + anchored),
              std::vector<int32_t>(reference.begin(), reference.begin() + anchored))
        << "plain greedy decoding disagrees with transformers";

    for (int k = 1; k <= 4; ++k) {
      for (gates::DraftSource source :
           {gates::DraftSource::kMtp, gates::DraftSource::kOracle, gates::DraftSource::kRandomPrefix}) {
        const gates::IdentityCase c{.prompt = prompt,
                                    .sampling = greedy(),
                                    .num_draft = k,
                                    .source = source,
                                    .num_tokens = kTokens,
                                    .drafter_seed = static_cast<uint64_t>(100 * k + pi)};
        Expected<gates::IdentityReport> r = gates::check_identity(*g->gen, c, &plain->tokens);
        ASSERT_TRUE(r.has_value()) << r.status().to_string();
        const std::string what =
            fmt::format("K={} {}: {}", k, gates::draft_source_name(source), r->summary());
        EXPECT_TRUE(r->identical()) << what;
        EXPECT_GT(r->stats.cycles, 0) << what;
        if (source == gates::DraftSource::kOracle) {
          EXPECT_TRUE(r->all_accepted()) << what;
        }
        // (Short reduced runs have too few cycles to see every length.)
        if (source == gates::DraftSource::kRandomPrefix && kFullSize) {
          EXPECT_TRUE(r->all_lengths(k)) << what;
        }
        if (pi == 2 && k == 2)
          std::printf("%s prompt %zu: %s\n", GetParam().c_str(), prompt.size(), what.c_str());
      }
    }
  }
}

// Adaptive drafting (DecodeRequest::adaptive_draft, draft_policy.h) with the real MTP head: each step drafts
// 0..K tokens as the request's acceptance and step times say, and the tokens are those of plain decoding,
// greedy and seeded. Which steps draft depends on measured times; that every request starts with two
// cycles at K and two plain steps (the policy's exploration) does not, so both kinds of step always occur.
TEST_P(GreedyIdentity, AdaptiveDraftingEqualsPlainDecoding) {
  if (skip_in_reduced_run(GetParam())) GTEST_SKIP() << "reduced (unoptimized) build";
  std::unique_ptr<GeneratorFixture> g = GeneratorFixture::open(GetParam());
  ASSERT_NE(g, nullptr);
  const std::vector<std::vector<int32_t>> prompts = g->prompts();
  for (size_t pi : {size_t{1}, size_t{2}}) {
    for (const SamplingParams& sp : {greedy(), seeded(0.8f, 0.9f, 7 + pi)}) {
      DecodeRequest req;
      req.prompt = prompts[pi];
      req.sampling = sp;
      req.max_tokens = kTokens;
      Expected<DecodeResult> plain = g->gen->generate(req);
      ASSERT_TRUE(plain.has_value()) << plain.status().to_string();
      for (int k : {2, 4}) {
        SCOPED_TRACE(fmt::format("{} prompt of {} tokens, {}, K={}", GetParam(), req.prompt.size(),
                                 sp.is_greedy() ? "greedy" : "seeded", k));
        DecodeRequest adaptive = req;
        adaptive.num_draft = k;
        adaptive.adaptive_draft = true;
        Expected<DecodeResult> r = g->gen->generate(adaptive);
        ASSERT_TRUE(r.has_value()) << r.status().to_string();
        EXPECT_EQ(r->tokens, plain->tokens);
        EXPECT_GE(r->accept.cycles, 2);
        EXPECT_GE(r->plain_steps, 2);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GreedyIdentity, ::testing::ValuesIn(golden::fixture_names()),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string n = p.param;
                           for (char& ch : n) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace pd::exactness
