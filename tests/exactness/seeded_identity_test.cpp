// Seeded identity and rollback through the real generator, on every fixture (docs/spec/speculative.md §2-3):
//   - seeded exact mode at T = 0.7 and 1.0 with top-p 0.9, seeds 1, 2, 3: the tokens of MTP cycles (the
//     MTP head drafting at the target's temperature or a colder one, and a random-prefix drafter, K = 1..4
//     spread over the six pairs) equal the plain seeded sampler's, 256 tokens each;
//   - rollback leaves no trace: after a speculative run the committed state (KV rows, GDN conv and
//     recurrent states) is bitwise the state plain decoding leaves, also when a stop token cuts a cycle.
#include <fmt/format.h>

#include "exactness/generator_test_util.h"

namespace pd::exactness {
namespace {

const int kTokens = full_or(256, 32);

std::string param_name(const ::testing::TestParamInfo<std::string>& p) {
  std::string n = p.param;
  for (char& ch : n) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return n;
}

class SeededIdentity : public ::testing::TestWithParam<std::string> {};

TEST_P(SeededIdentity, MtpCyclesEqualPlainSeededSampling) {
  if (skip_in_reduced_run(GetParam())) GTEST_SKIP() << "reduced (unoptimized) build";
  std::unique_ptr<GeneratorFixture> g = GeneratorFixture::open(GetParam());
  ASSERT_NE(g, nullptr);
  const std::vector<int32_t> prompt = g->prompts()[1];
  for (float temperature : {0.7f, 1.0f}) {
    for (uint64_t seed : {1u, 2u, 3u}) {
      SCOPED_TRACE(fmt::format("{} T={} seed {}", GetParam(), temperature, seed));
      const SamplingParams sp = seeded(temperature, 0.9f, seed);
      DecodeRequest plain_req;
      plain_req.prompt = prompt;
      plain_req.sampling = sp;
      plain_req.max_tokens = kTokens + 4;
      Expected<DecodeResult> plain = g->gen->generate(plain_req);
      ASSERT_TRUE(plain.has_value()) << plain.status().to_string();
      // A different seed gives different tokens (the seed really drives the sampler).
      if (seed == 1) {
        DecodeRequest other = plain_req;
        other.sampling.seed = 99;
        Expected<DecodeResult> o = g->gen->generate(other);
        ASSERT_TRUE(o.has_value());
        EXPECT_NE(o->tokens, plain->tokens);
      }
      struct Run {
        int k;
        gates::DraftSource source;
        std::optional<float> draft_temperature;
      };
      // Six (temperature, seed) pairs share out the runs: the MTP head at every K = 1..4 (at the target's
      // temperature, and once colder), a random-prefix drafter at every K.
      const int ti = temperature == 1.0f ? 1 : 0;
      const int k = static_cast<int>((seed - 1 + 3 * ti) % 4) + 1;
      std::vector<Run> runs = {Run{k, gates::DraftSource::kMtp, {}},
                               Run{5 - k, gates::DraftSource::kRandomPrefix, {}}};
      if (seed == 2) runs.push_back(Run{2, gates::DraftSource::kMtp, 0.5f * temperature});
      for (const Run& run : runs) {
        gates::IdentityCase c{.prompt = prompt,
                              .sampling = sp,
                              .num_draft = run.k,
                              .source = run.source,
                              .num_tokens = kTokens,
                              .drafter_seed = seed,
                              .draft_temperature = run.draft_temperature};
        Expected<gates::IdentityReport> r = gates::check_identity(*g->gen, c, &plain->tokens);
        ASSERT_TRUE(r.has_value()) << r.status().to_string();
        const std::string what = fmt::format(
            "K={} {}{}: {}", run.k, gates::draft_source_name(run.source),
            run.draft_temperature ? fmt::format(" draft T={}", *run.draft_temperature) : std::string(),
            r->summary());
        EXPECT_TRUE(r->identical()) << what;
        if (run.source == gates::DraftSource::kRandomPrefix && kFullSize) {
          EXPECT_TRUE(r->all_lengths(run.k)) << what;
        }
        if (seed == 2) std::printf("%s: %s\n", GetParam().c_str(), what.c_str());
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SeededIdentity, ::testing::ValuesIn(golden::fixture_names()), param_name);

class RollbackState : public ::testing::TestWithParam<std::string> {};

TEST_P(RollbackState, SpeculativeRunsLeaveThePlainState) {
  if (skip_in_reduced_run(GetParam())) GTEST_SKIP() << "reduced (unoptimized) build";
  std::unique_ptr<GeneratorFixture> g = GeneratorFixture::open(GetParam());
  ASSERT_NE(g, nullptr);
  Backend& be = *g->fx->backend;
  const std::vector<int32_t> prompt = g->prompts()[1];
  const int kN = full_or(100, 40);
  for (bool with_stop : {false, true}) {
    SCOPED_TRACE(with_stop ? "cut by a stop token" : "cut by max_tokens");
    DecodeRequest req;
    req.prompt = prompt;
    req.sampling = greedy();
    req.max_tokens = kN + 4;
    Expected<DecodeResult> full = g->gen->generate(req);
    ASSERT_TRUE(full.has_value());
    req.max_tokens = kN;
    if (with_stop) {
      // The first occurrence of a token after position 40 stops both runs there, mid-cycle for most K.
      req.stop_token_ids = {full->tokens[41]};
    }
    Expected<DecodeResult> plain = g->gen->generate(req);
    ASSERT_TRUE(plain.has_value());
    const StateDump want = dump_state(be, g->gen->state());
    EXPECT_EQ(want.length, static_cast<int>(prompt.size() + plain->tokens.size()) - 1);
    for (int k = 1; k <= 4; ++k) {
      for (gates::DraftSource source :
           {gates::DraftSource::kMtp, gates::DraftSource::kRandomPrefix, gates::DraftSource::kOracle}) {
        SCOPED_TRACE(fmt::format("K={} {}", k, gates::draft_source_name(source)));
        std::unique_ptr<ScriptedDrafter> scripted;
        if (source != gates::DraftSource::kMtp) {
          scripted = std::make_unique<ScriptedDrafter>(full->tokens,
                                                       source == gates::DraftSource::kOracle
                                                           ? ScriptedDrafter::Mode::kOracle
                                                           : ScriptedDrafter::Mode::kRandomPrefix,
                                                       g->vocab(), 7 * k);
        }
        DecodeRequest spec = req;
        spec.num_draft = k;
        spec.drafter = scripted.get();
        Expected<DecodeResult> r = g->gen->generate(spec);
        ASSERT_TRUE(r.has_value()) << r.status().to_string();
        EXPECT_EQ(r->tokens, plain->tokens);
        EXPECT_EQ(r->reason, plain->reason);
        EXPECT_TRUE(dump_state(be, g->gen->state()) == want)
            << "the committed state differs from plain decoding";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RollbackState, ::testing::ValuesIn(golden::fixture_names()), param_name);

}  // namespace
}  // namespace pd::exactness
