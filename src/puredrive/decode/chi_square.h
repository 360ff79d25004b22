// Pearson chi-square goodness of fit, for the exactness tests of speculative sampling
// (docs/spec/speculative.md §3): observed counts of outcomes against their exact probabilities. Cells whose
// expected count is below min_expected are pooled into one cell (merged into the smallest regular cell if the
// pool itself stays below it). Observations in a cell of probability 0 make the test fail outright (p = 0):
// an exact sampler never produces them.
//
// The p-value is the chi-square survival function Q(dof/2, x/2), the regularized upper incomplete gamma
// function, computed here (series below a + 1, Lentz continued fraction above) so no statistics library
// is needed. chi_square_test.cpp checks it against closed forms (even dof: Poisson sums; dof 1: erfc).
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace pd {

// Regularized upper incomplete gamma Q(a, x) = Gamma(a, x) / Gamma(a), a > 0, x >= 0.
double regularized_gamma_q(double a, double x);

// P(X >= statistic) for X ~ chi-square(dof).
double chi_square_survival(double statistic, int dof);

struct ChiSquareResult {
  double statistic = 0.0;
  int dof = 0;
  double p_value = 1.0;
  int64_t samples = 0;
  int cells = 0;           // cells after pooling
  int pooled_cells = 0;    // original cells that went into the pool
  int64_t impossible = 0;  // observations in zero-probability cells

  std::string summary() const;  // "chi2=512.3 dof=498 p=0.31 (N=20000, 499 cells, 77 pooled)"
};

// observed[i] counts outcome i; expected_probs[i] is its exact probability (renormalised if the sum is
// off by rounding). The spans must have the same size.
ChiSquareResult chi_square_goodness_of_fit(std::span<const int64_t> observed,
                                           std::span<const double> expected_probs, double min_expected = 5.0);

}  // namespace pd
