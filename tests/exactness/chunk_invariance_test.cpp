// Chunking invariance on the CPU backend (docs/DESIGN.md §4.6): a 330-token prompt prefilled in one piece,
// in 2 and in 5 pieces whose boundaries are multiples of 64 leaves bitwise the same KV cache, GDN conv and
// recurrent states, and last-row logits, on every fixture.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "exactness/chunked_prefill.h"
#include "golden/fixture_util.h"

namespace pd {
namespace {

class ChunkInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(ChunkInvariance, PrefillPiecesGiveTheSameBits) {
  constexpr int kTokens = 330;
  Expected<std::unique_ptr<golden::Fixture>> fx = golden::Fixture::open(GetParam(), 2, kTokens);
  ASSERT_TRUE(fx.has_value()) << fx.status().to_string();
  Model& m = *(*fx)->model;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> dist(0, m.config().vocab_size - 1);
  std::vector<int32_t> tokens(kTokens);
  for (int32_t& t : tokens) t = dist(rng);
  const std::vector<std::vector<int>> splits = test::chunk_splits(kTokens);
  const test::PrefillResult whole = test::chunked_prefill(m, tokens, splits[0], DType::kBF16);
  for (size_t i = 1; i < splits.size(); ++i) {
    SCOPED_TRACE(fmt::format("{} pieces", splits[i].size()));
    const test::PrefillResult pieces = test::chunked_prefill(m, tokens, splits[i], DType::kBF16);
    EXPECT_TRUE(pieces.logits == whole.logits) << "last-row logits";
    ASSERT_EQ(pieces.state.size(), whole.state.size());
    for (size_t t = 0; t < whole.state.size(); ++t) {
      EXPECT_TRUE(pieces.state[t] == whole.state[t])
          << "state tensor " << t << " (per layer: K, V or conv, recurrent)";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ChunkInvariance, ::testing::ValuesIn(golden::fixture_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string s = i.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace pd
