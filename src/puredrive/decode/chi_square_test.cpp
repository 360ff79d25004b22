// The chi-square p-value against closed forms of the regularized incomplete gamma function and textbook
// critical values, and the pooling rule on a hand-computed example.
#include "puredrive/decode/chi_square.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace pd {
namespace {

// Q(n, x) = e^-x sum_{i<n} x^i / i! for integer n (the Poisson tail identity).
double q_integer(int n, double x) {
  double term = std::exp(-x);
  double sum = term;
  for (int i = 1; i < n; ++i) {
    term *= x / i;
    sum += term;
  }
  return sum;
}

// Q(n + 1/2, x) from Q(1/2, x) = erfc(sqrt x) and Q(a + 1, x) = Q(a, x) + x^a e^-x / Gamma(a + 1).
double q_half_integer(int n, double x) {
  double q = std::erfc(std::sqrt(x));
  for (int i = 0; i < n; ++i) {
    const double a = i + 0.5;
    q += std::exp(a * std::log(x) - x - std::lgamma(a + 1.0));
  }
  return q;
}

TEST(ChiSquare, IncompleteGammaMatchesClosedForms) {
  for (int n = 1; n <= 60; ++n) {
    for (double x : {0.01, 0.5, 1.0, 3.0, 10.0, 30.0, 80.0, 200.0}) {
      const double ref = q_integer(n, x);
      if (ref < 1e-250) continue;
      EXPECT_NEAR(regularized_gamma_q(n, x), ref, 1e-12 + 1e-10 * ref) << "a=" << n << " x=" << x;
      const double ref_half = q_half_integer(n, x);
      EXPECT_NEAR(regularized_gamma_q(n + 0.5, x), ref_half, 1e-12 + 1e-9 * ref_half)
          << "a=" << n + 0.5 << " x=" << x;
    }
  }
}

TEST(ChiSquare, SurvivalMatchesTextbookCriticalValues) {
  // Upper 5% and 0.1% points of the chi-square distribution (standard tables).
  EXPECT_NEAR(chi_square_survival(3.841458820694124, 1), 0.05, 1e-9);
  EXPECT_NEAR(chi_square_survival(18.307038053275146, 10), 0.05, 1e-9);
  EXPECT_NEAR(chi_square_survival(124.34211340400407, 100), 0.05, 1e-9);
  EXPECT_NEAR(chi_square_survival(10.827566170662733, 1), 0.001, 1e-11);
  EXPECT_NEAR(chi_square_survival(29.58829844507442, 10), 0.001, 1e-11);
  EXPECT_EQ(chi_square_survival(0.0, 5), 1.0);
}

TEST(ChiSquare, PoolsSmallCellsAsDocumented) {
  // N = 35: expected 10.5, 17.5, 3.5, 3.5. The two small cells pool into one of 7 (observed 5).
  const std::vector<int64_t> observed = {10, 20, 3, 2};
  const std::vector<double> probs = {0.3, 0.5, 0.1, 0.1};
  const ChiSquareResult r = chi_square_goodness_of_fit(observed, probs);
  EXPECT_EQ(r.samples, 35);
  EXPECT_EQ(r.pooled_cells, 2);
  EXPECT_EQ(r.cells, 3);
  EXPECT_EQ(r.dof, 2);
  const double stat = 0.25 / 10.5 + 6.25 / 17.5 + 4.0 / 7.0;
  EXPECT_NEAR(r.statistic, stat, 1e-12);
  EXPECT_NEAR(r.p_value, std::exp(-stat / 2), 1e-12);  // dof 2: Q(1, x/2) = e^(-x/2)
}

TEST(ChiSquare, PoolBelowThresholdJoinsTheSmallestRegularCell) {
  // N = 100: expected 60, 36, 4 -> the lone small cell (4 < 5) joins the 36 cell.
  const std::vector<int64_t> observed = {58, 38, 4};
  const std::vector<double> probs = {0.6, 0.36, 0.04};
  const ChiSquareResult r = chi_square_goodness_of_fit(observed, probs);
  EXPECT_EQ(r.cells, 2);
  EXPECT_NEAR(r.statistic, 4.0 / 60 + 4.0 / 40, 1e-12);
}

TEST(ChiSquare, ObservationInZeroProbabilityCellFails) {
  const std::vector<int64_t> observed = {50, 49, 1};
  const std::vector<double> probs = {0.5, 0.5, 0.0};
  const ChiSquareResult r = chi_square_goodness_of_fit(observed, probs);
  EXPECT_EQ(r.impossible, 1);
  EXPECT_EQ(r.p_value, 0.0);
}

}  // namespace
}  // namespace pd
