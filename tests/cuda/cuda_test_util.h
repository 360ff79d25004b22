// Shared by the CUDA tests: the CUDA backend or a skip (CI machines have no GPU), and comparisons.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "puredrive/backend/backend.h"

namespace pd::cudatest {

// PD_CUDA_TEST_QUICK=1 (under compute-sanitizer): fewer sizes and shorter loops, the same checks.
inline bool quick() {
  return std::getenv("PD_CUDA_TEST_QUICK") != nullptr;
}

// PD_CUDA_TEST_SMALL=1 (under racecheck, which is slow on big grids): the attention and MoE tests run only
// their smallest case.
inline bool small() {
  return std::getenv("PD_CUDA_TEST_SMALL") != nullptr;
}

// The CUDA backend, or null with the reason in *why.
inline std::unique_ptr<Backend> try_cuda(std::string* why) {
  Expected<std::unique_ptr<Backend>> b = create_backend({.name = "cuda"});
  if (!b.has_value()) {
    *why = b.status().to_string();
    return nullptr;
  }
  return std::move(b).value();
}

#define PD_CUDA_OR_SKIP(var)                                        \
  std::string pd_skip_why_;                                         \
  std::unique_ptr<Backend> var = cudatest::try_cuda(&pd_skip_why_); \
  if (var == nullptr) GTEST_SKIP() << "no CUDA device: " << pd_skip_why_

// max |a - ref| / max |ref|; infinity on a size mismatch.
inline double rel_err(const std::vector<float>& a, const std::vector<float>& ref) {
  if (a.size() != ref.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - ref[i]);
    num = std::isnan(d) ? INFINITY : std::max(num, d);
    den = std::max(den, std::abs(static_cast<double>(ref[i])));
  }
  return den == 0 ? num : num / den;
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <typename T>
std::vector<T> download(Backend& be, const Tensor& t) {
  std::vector<T> v(static_cast<size_t>(t.rows * t.cols));
  const Status s = be.download(v.data(), t);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return v;
}

inline std::vector<uint8_t> download_bytes(Backend& be, const Tensor& t) {
  std::vector<uint8_t> v(static_cast<size_t>(t.nbytes()));
  const Status s = be.download(v.data(), t);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return v;
}

// Rows [begin, begin + count) of a row-major host array of width cols.
template <typename T>
std::vector<T> rows_of(const std::vector<T>& v, int64_t cols, int64_t begin, int64_t count) {
  return std::vector<T>(v.begin() + begin * cols, v.begin() + (begin + count) * cols);
}

}  // namespace pd::cudatest
