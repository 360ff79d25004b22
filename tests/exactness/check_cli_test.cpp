// `puredrive check` end to end: it passes on every fixture, and it fails loudly (exit status 1, FAIL rows,
// "check FAILED") when the hidden flag forces a wrong acceptance rule. The small-vocabulary fixture runs the
// chi-square gate at full size (20,000 samples); the others skip it (vocabulary > 64). Identity gates run
// 64 tokens (32 on the tiny coder) to keep the test short; greedy_identity_test.cpp runs 256.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "cli_run.h"
#include "exactness/generator_test_util.h"
#include "golden/fixture_util.h"

namespace pd {
namespace {

using test::CliRun;

CliRun run(const std::string& args) {
  return test::run_cli(args, true);
}

constexpr const char* kSmallVocab = "qwen35-smallvocab-f32";

class CheckCli : public ::testing::TestWithParam<std::string> {};

TEST_P(CheckCli, PassesOnTheFixture) {
  // The reduced (sanitizer) run checks one fixture per architecture.
  if (!exactness::kFullSize && GetParam() != kSmallVocab && GetParam() != "qwen3next-f32") {
    GTEST_SKIP() << "reduced (unoptimized) build";
  }
  const bool small_vocab = GetParam() == kSmallVocab;
  // Short identity runs (the identity tests run 256 tokens); the chi-square runs at its full 20,000 samples.
  const int tokens = exactness::full_or(GetParam() == "tiny-coder" ? 32 : 64, 16);
  const int samples = exactness::full_or(20000, 1500);
  const CliRun r = run(fmt::format("check --model {}/{} --threads 1 --tokens {} --samples {}",
                                   golden::fixtures_dir(), GetParam(), tokens, samples));
  std::printf("%s\n", r.out.c_str());
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("check PASSED"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("row exactness"), std::string::npos);
  EXPECT_NE(r.out.find("greedy identity"), std::string::npos);
  EXPECT_NE(r.out.find("seeded identity"), std::string::npos);
  if (small_vocab) {
    EXPECT_NE(r.out.find(fmt::format("N={}", samples)), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("block >= token     ok"), std::string::npos) << r.out;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CheckCli, ::testing::ValuesIn(golden::fixture_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string s = i.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

TEST(CheckCliFaulty, WrongRulesFailLoudly) {
  if (!exactness::kFullSize) GTEST_SKIP() << "rejecting needs the full 20,000 samples (optimized build)";
  for (const char* rule : {"uncapped", "first-failure"}) {
    const CliRun r =
        run(fmt::format("check --model {}/{} --threads 1 --gates chi-square --testonly-faulty-rule {}",
                        golden::fixtures_dir(), kSmallVocab, rule));
    std::printf("%s\n", r.out.c_str());
    EXPECT_EQ(r.rc, 1) << rule << "\n" << r.out;
    EXPECT_NE(r.out.find("check FAILED"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("chi-square         FAIL"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("WRONG rule"), std::string::npos) << r.out;
  }
}

TEST(CheckCliFaulty, AFaultNoGateCanSeeIsAFailureToo) {
  // Vocabulary 256: no chi-square by default, so the forced fault cannot be detected; check must not pass.
  const CliRun r =
      run(fmt::format("check --model {}/qwen35-text-f32 --threads 1 --gates row --testonly-faulty-rule "
                      "uncapped",
                      golden::fixtures_dir()));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("faulty rule"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace pd
