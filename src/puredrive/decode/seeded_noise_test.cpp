// Seeded noise: uniformity and independence of the counter-based hash, and the Gumbel-max trick
// (sample_seeded over positions draws from the distribution).
#include "puredrive/decode/seeded_noise.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <vector>

#include "puredrive/decode/chi_square.h"
#include "puredrive/decode/sampler.h"

namespace pd {
namespace {

TEST(SeededNoise, IsAPureFunctionInsideTheOpenInterval) {
  EXPECT_EQ(noise_bits(1, 2, 3), noise_bits(1, 2, 3));
  EXPECT_NE(noise_bits(1, 2, 3), noise_bits(2, 2, 3));
  EXPECT_NE(noise_bits(1, 2, 3), noise_bits(1, 3, 3));
  EXPECT_NE(noise_bits(1, 2, 3), noise_bits(1, 2, 4));
  EXPECT_NE(noise_bits(1, 2, 3), noise_bits(1, 3, 2));  // position and token are not interchangeable
  EXPECT_GT(bits_to_open_unit(0), 0.0);
  EXPECT_LT(bits_to_open_unit(~uint64_t{0}), 1.0);
  EXPECT_TRUE(std::isfinite(-std::log(-std::log(bits_to_open_unit(0)))));
  EXPECT_TRUE(std::isfinite(-std::log(-std::log(bits_to_open_unit(~uint64_t{0})))));
}

TEST(SeededNoise, UniformOverPositionsAndTokens) {
  constexpr int kBins = 64;
  std::vector<int64_t> counts(kBins, 0);
  for (int64_t pos = 0; pos < 2000; ++pos) {
    for (int32_t tok = 0; tok < 100; ++tok) ++counts[static_cast<int>(noise_uniform(42, pos, tok) * kBins)];
  }
  const std::vector<double> probs(kBins, 1.0 / kBins);
  const ChiSquareResult r = chi_square_goodness_of_fit(counts, probs);
  std::printf("noise uniformity: %s\n", r.summary().c_str());
  EXPECT_GT(r.p_value, 1e-3);
}

TEST(SeededNoise, NeighbouringPositionsAndTokensAreIndependent) {
  constexpr int kBins = 8;
  std::vector<int64_t> by_position(kBins * kBins, 0), by_token(kBins * kBins, 0), by_seed(kBins * kBins, 0);
  const auto bin = [](double u) { return static_cast<int>(u * kBins); };
  for (int64_t pos = 0; pos < 400; ++pos) {
    for (int32_t tok = 0; tok < 100; ++tok) {
      const int a = bin(noise_uniform(7, pos, tok));
      ++by_position[a * kBins + bin(noise_uniform(7, pos + 1, tok))];
      ++by_token[a * kBins + bin(noise_uniform(7, pos, tok + 1))];
      ++by_seed[a * kBins + bin(noise_uniform(8, pos, tok))];
    }
  }
  const std::vector<double> probs(kBins * kBins, 1.0 / (kBins * kBins));
  for (const auto* counts : {&by_position, &by_token, &by_seed}) {
    const ChiSquareResult r = chi_square_goodness_of_fit(*counts, probs);
    std::printf("noise pair independence: %s\n", r.summary().c_str());
    EXPECT_GT(r.p_value, 1e-3);
  }
}

TEST(SeededNoise, GumbelArgmaxOverPositionsDrawsFromTheDistribution) {
  std::mt19937_64 gen(9);
  std::vector<double> w(24);
  std::exponential_distribution<double> expo(1.0);
  for (double& x : w) x = expo(gen) * expo(gen);
  w[5] = 0.0;  // a masked token must never come out
  const TokenDistribution d = distribution_from_weights(w);
  for (uint64_t seed : {1u, 2u}) {
    std::vector<int64_t> counts(w.size(), 0);
    for (int64_t pos = 0; pos < 40000; ++pos) ++counts[sample_seeded(d, seed, pos)];
    const ChiSquareResult r = chi_square_goodness_of_fit(counts, d.probs);
    std::printf("seed %llu gumbel-max: %s\n", static_cast<unsigned long long>(seed), r.summary().c_str());
    EXPECT_EQ(r.impossible, 0);
    EXPECT_GT(r.p_value, 1e-3);
  }
}

TEST(Rng, ReproducibleAndUniform) {
  Rng a(5), b(5), c(6);
  EXPECT_EQ(a.next_u64(), b.next_u64());
  EXPECT_NE(a.next_u64(), c.next_u64());
  constexpr int kBins = 50;
  std::vector<int64_t> counts(kBins, 0);
  for (int i = 0; i < 100000; ++i) {
    const double u = a.uniform();
    ASSERT_GT(u, 0.0);
    ASSERT_LT(u, 1.0);
    ++counts[static_cast<int>(u * kBins)];
  }
  const ChiSquareResult r = chi_square_goodness_of_fit(counts, std::vector<double>(kBins, 1.0 / kBins));
  EXPECT_GT(r.p_value, 1e-3) << r.summary();
}

}  // namespace
}  // namespace pd
