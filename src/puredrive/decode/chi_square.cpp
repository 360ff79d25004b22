#include "puredrive/decode/chi_square.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "puredrive/util/status.h"

namespace pd {
namespace {

constexpr double kEps = 1e-15;
constexpr double kTiny = 1e-300;
constexpr int kMaxIterations = 100000;

// x^a e^-x / Gamma(a), the common prefactor of both expansions, in logs to survive large a and x.
double gamma_prefactor(double a, double x) {
  return std::exp(a * std::log(x) - x - std::lgamma(a));
}

// P(a, x) by the series  x^a e^-x / Gamma(a+1) * sum_n x^n / ((a+1)...(a+n)); converges fast for x < a+1.
double lower_series(double a, double x) {
  double term = 1.0 / a;
  double sum = term;
  for (int n = 1; n < kMaxIterations; ++n) {
    term *= x / (a + n);
    sum += term;
    if (std::fabs(term) < std::fabs(sum) * kEps) break;
  }
  return sum * gamma_prefactor(a, x);
}

// Q(a, x) by the continued fraction  1/(x+1-a- 1(1-a)/(x+3-a- 2(2-a)/(x+5-a- ...))), evaluated with the
// modified Lentz method; converges fast for x >= a+1.
double upper_continued_fraction(double a, double x) {
  double b = x + 1.0 - a;
  double c = 1.0 / kTiny;
  double d = 1.0 / b;
  double h = d;
  for (int i = 1; i < kMaxIterations; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = b + an / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1.0 / d;
    const double delta = d * c;
    h *= delta;
    if (std::fabs(delta - 1.0) < kEps) break;
  }
  return h * gamma_prefactor(a, x);
}

}  // namespace

double regularized_gamma_q(double a, double x) {
  PD_ASSERT(a > 0.0 && x >= 0.0, "regularized_gamma_q({}, {}): need a > 0 and x >= 0", a, x);
  if (x == 0.0) return 1.0;
  if (std::isinf(x)) return 0.0;
  if (x < a + 1.0) return std::clamp(1.0 - lower_series(a, x), 0.0, 1.0);
  return std::clamp(upper_continued_fraction(a, x), 0.0, 1.0);
}

double chi_square_survival(double statistic, int dof) {
  PD_ASSERT(dof > 0, "chi_square_survival: dof must be > 0, got {}", dof);
  if (!(statistic > 0.0)) return 1.0;
  return regularized_gamma_q(0.5 * dof, 0.5 * statistic);
}

std::string ChiSquareResult::summary() const {
  std::string s = fmt::format("chi2={:.2f} dof={} p={:.4g} (N={}, {} cells, {} pooled)", statistic, dof,
                              p_value, samples, cells, pooled_cells);
  if (impossible > 0) s += fmt::format(", {} observations in zero-probability cells", impossible);
  return s;
}

ChiSquareResult chi_square_goodness_of_fit(std::span<const int64_t> observed,
                                           std::span<const double> expected_probs, double min_expected) {
  PD_ASSERT(observed.size() == expected_probs.size(), "chi-square: {} observed cells vs {} probabilities",
            observed.size(), expected_probs.size());
  ChiSquareResult result;
  double total_prob = 0.0;
  for (size_t i = 0; i < observed.size(); ++i) {
    PD_ASSERT(expected_probs[i] >= 0.0, "chi-square: negative probability {} in cell {}", expected_probs[i],
              i);
    result.samples += observed[i];
    total_prob += expected_probs[i];
  }
  PD_ASSERT(total_prob > 0.0, "chi-square: all probabilities are 0");
  const auto n = static_cast<double>(result.samples);

  struct Cell {
    double expected;
    int64_t observed;
  };
  std::vector<Cell> regular;
  Cell pool{0.0, 0};
  for (size_t i = 0; i < observed.size(); ++i) {
    const double e = n * expected_probs[i] / total_prob;
    if (expected_probs[i] == 0.0) {
      result.impossible += observed[i];
    } else if (e < min_expected) {
      pool.expected += e;
      pool.observed += observed[i];
      ++result.pooled_cells;
    } else {
      regular.push_back({e, observed[i]});
    }
  }
  if (result.pooled_cells > 0) {
    if (pool.expected < min_expected && !regular.empty()) {
      auto smallest = std::min_element(regular.begin(), regular.end(),
                                       [](const Cell& a, const Cell& b) { return a.expected < b.expected; });
      smallest->expected += pool.expected;
      smallest->observed += pool.observed;
    } else {
      regular.push_back(pool);
    }
  }
  result.cells = static_cast<int>(regular.size());
  for (const Cell& c : regular) {
    const double diff = static_cast<double>(c.observed) - c.expected;
    result.statistic += diff * diff / c.expected;
  }
  result.dof = result.cells - 1;
  if (result.impossible > 0) {
    result.statistic = std::numeric_limits<double>::infinity();
    result.p_value = 0.0;
  } else {
    result.p_value = result.dof > 0 ? chi_square_survival(result.statistic, result.dof) : 1.0;
  }
  return result;
}

}  // namespace pd
