// Shared by the CUDA tests: the CUDA backend or a skip (CI machines have no GPU), and comparisons.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "puredrive/backend/backend.h"
#include "puredrive/backend/cpu/test_util.h"

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

// A test fixture with the CUDA backend (gpu_) and the CPU reference (cpu_, cpu_threads threads); every test
// skips itself without a GPU.
class GpuAndCpu : public ::testing::Test {
 protected:
  explicit GpuAndCpu(int cpu_threads = 2) : cpu_threads_(cpu_threads) {}
  void SetUp() override {
    std::string why;
    gpu_ = try_cuda(&why);
    if (gpu_ == nullptr) GTEST_SKIP() << "no CUDA device: " << why;
    cpu_ = test::cpu_backend(cpu_threads_);
  }
  std::unique_ptr<Backend> cpu_, gpu_;

 private:
  int cpu_threads_;
};

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

// Relative error (max |a - ref| / max |ref|) the tensor-core prefill products may show against f32
// (kernels.h: activations and non-bf16 weights enter as bf16 hi + lo, about 2^-17 each, and the tensor cores
// accumulate in f32 with truncation): a host emulation of the split gives up to 7e-6 at K = 64..2048; an f32
// product is near 1e-7, a plain bf16 one near 1e-3, an indexing error near 1.
constexpr double kMmaTolerance = 5e-5;

// A weight format to test, with the affine parameters.
struct FormatCase {
  WeightFormat format;
  int bits = 0;
  int group = 32;
  DType scale_dtype = DType::kBF16;
};

inline std::string describe(const FormatCase& f) {
  return f.format == WeightFormat::kAffine
             ? fmt::format("affine{} g{} {}", f.bits, f.group, dtype_name(f.scale_dtype))
             : weight_format_name(f.format);
}

// Random MoE weights: a bf16 router and shared gate, experts and the shared expert in the given formats.
// The shared expert has the experts' width unless shared_inter > 0.
struct MoeFixture {
  std::vector<std::unique_ptr<test::OwnedMatrix>> owned;  // owned[0] is the router
  MoeWeights w;
  int64_t hidden = 0;
};

inline MoeFixture make_moe(std::mt19937& rng, int experts, int64_t hidden, int64_t inter, FormatCase gate_f,
                           FormatCase up_f, FormatCase down_f, int64_t shared_inter = 0,
                           FormatCase shared_f = {WeightFormat::kBF16}, bool shared_own_format = false,
                           FormatCase router_f = {WeightFormat::kBF16}) {
  MoeFixture f;
  f.hidden = hidden;
  auto mk = [&](int64_t rows, int64_t cols, const FormatCase& fc, float scale) {
    f.owned.push_back(
        test::make_matrix(rng, rows, cols, fc.format, fc.bits, fc.group, scale, fc.scale_dtype));
    return f.owned.back()->m;
  };
  const float s = 1.0f / std::sqrt(static_cast<float>(hidden));
  const int64_t si = shared_inter > 0 ? shared_inter : inter;
  f.w.gate = mk(experts, hidden, router_f, 1.0f);
  f.w.shared_expert_gate = mk(1, hidden, router_f, s);
  f.w.shared_gate_proj = mk(si, hidden, shared_own_format ? shared_f : gate_f, s);
  f.w.shared_up_proj = mk(si, hidden, shared_own_format ? shared_f : up_f, s);
  f.w.shared_down_proj = mk(hidden, si, shared_own_format ? shared_f : down_f, s);
  for (int e = 0; e < experts; ++e) {
    f.w.gate_proj.push_back(mk(inter, hidden, gate_f, s));
    f.w.up_proj.push_back(mk(inter, hidden, up_f, s));
    f.w.down_proj.push_back(mk(hidden, inter, down_f, s));
  }
  return f;
}

}  // namespace pd::cudatest
