// The MoE block against a naive double-precision reference of spec §6 (softmax router, top-k, renormalise,
// SwiGLU experts, sigmoid-gated shared expert) in several weight formats; row-exactness, thread independence.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "puredrive/backend/cpu/test_util.h"

namespace pd {
namespace {

using test::device_tensor;
using test::to_host;

struct MoeCase {
  int64_t hidden = 64, inter = 32, shared = 64;
  int experts = 6, top_k = 2;
  std::unique_ptr<test::OwnedMatrix> gate, sg, sgate, sup, sdown;
  std::vector<std::unique_ptr<test::OwnedMatrix>> g, u, d;
  MoeWeights weights() const {
    MoeWeights w;
    w.gate = gate->m;
    w.shared_expert_gate = sg->m;
    w.shared_gate_proj = sgate->m;
    w.shared_up_proj = sup->m;
    w.shared_down_proj = sdown->m;
    for (int e = 0; e < experts; ++e) {
      w.gate_proj.push_back(g[static_cast<size_t>(e)]->m);
      w.up_proj.push_back(u[static_cast<size_t>(e)]->m);
      w.down_proj.push_back(d[static_cast<size_t>(e)]->m);
    }
    return w;
  }
};

MoeCase make_case(std::mt19937& rng, WeightFormat f, int bits, int64_t hidden = 64, int64_t inter = 32,
                  int64_t shared = 64) {
  MoeCase c;
  c.hidden = hidden;
  c.inter = inter;
  c.shared = shared;
  auto mk = [&](int64_t rows, int64_t cols) { return test::make_matrix(rng, rows, cols, f, bits, 32, 0.3f); };
  c.gate = test::make_matrix(rng, c.experts, c.hidden, WeightFormat::kF32, 0, 0, 1.0f);
  c.sg = mk(1, c.hidden);
  c.sgate = mk(c.shared, c.hidden);
  c.sup = mk(c.shared, c.hidden);
  c.sdown = mk(c.hidden, c.shared);
  for (int e = 0; e < c.experts; ++e) {
    c.g.push_back(mk(c.inter, c.hidden));
    c.u.push_back(mk(c.inter, c.hidden));
    c.d.push_back(mk(c.hidden, c.inter));
  }
  return c;
}

std::vector<double> matvec(const test::OwnedMatrix& m, const std::vector<double>& x) {
  std::vector<double> y(static_cast<size_t>(m.m.rows), 0.0);
  for (int64_t n = 0; n < m.m.rows; ++n) {
    for (int64_t k = 0; k < m.m.cols; ++k)
      y[static_cast<size_t>(n)] +=
          m.reference[static_cast<size_t>(n * m.m.cols + k)] * x[static_cast<size_t>(k)];
  }
  return y;
}

std::vector<double> swiglu(const test::OwnedMatrix& g, const test::OwnedMatrix& u, const test::OwnedMatrix& d,
                           const std::vector<double>& x) {
  std::vector<double> a = matvec(g, x);
  const std::vector<double> b = matvec(u, x);
  for (size_t i = 0; i < a.size(); ++i) a[i] = a[i] / (1.0 + std::exp(-a[i])) * b[i];
  return matvec(d, a);
}

std::vector<double> naive_moe(const MoeCase& c, const std::vector<float>& x, int64_t rows, bool renorm) {
  std::vector<double> out(static_cast<size_t>(rows * c.hidden));
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> xr(x.begin() + r * c.hidden, x.begin() + (r + 1) * c.hidden);
    std::vector<double> p = matvec(*c.gate, xr);
    const double mx = *std::max_element(p.begin(), p.end());
    double sum = 0;
    for (double& v : p) sum += (v = std::exp(v - mx));
    for (double& v : p) v /= sum;
    std::vector<int> order(static_cast<size_t>(c.experts));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    double top = 0;
    for (int i = 0; i < c.top_k; ++i) top += p[static_cast<size_t>(order[static_cast<size_t>(i)])];
    std::vector<double> y(static_cast<size_t>(c.hidden), 0.0);
    for (int i = 0; i < c.top_k; ++i) {
      const int e = order[static_cast<size_t>(i)];
      const double w = renorm ? p[static_cast<size_t>(e)] / top : p[static_cast<size_t>(e)];
      const auto ye = swiglu(*c.g[static_cast<size_t>(e)], *c.u[static_cast<size_t>(e)],
                             *c.d[static_cast<size_t>(e)], xr);
      for (int64_t n = 0; n < c.hidden; ++n) y[static_cast<size_t>(n)] += w * ye[static_cast<size_t>(n)];
    }
    const double sgate = 1.0 / (1.0 + std::exp(-matvec(*c.sg, xr)[0]));
    const auto ys = swiglu(*c.sgate, *c.sup, *c.sdown, xr);
    for (int64_t n = 0; n < c.hidden; ++n)
      out[static_cast<size_t>(r * c.hidden + n)] =
          y[static_cast<size_t>(n)] + sgate * ys[static_cast<size_t>(n)];
  }
  return out;
}

std::vector<float> run(const MoeCase& c, const std::vector<float>& x, int64_t rows,
                       const std::vector<int64_t>& steps, int threads, bool renorm) {
  auto be = test::cpu_backend(threads);
  const Expected<MoeId> id =
      be->bind_moe(c.weights(), {.num_experts_per_tok = c.top_k, .norm_topk_prob = renorm});
  EXPECT_TRUE(id.has_value()) << id.status().to_string();
  Buffer xt = device_tensor(*be, DType::kF32, rows, c.hidden, x);
  Buffer out = be->alloc(DType::kF32, rows, c.hidden).value();
  int64_t t0 = 0;
  for (int64_t n : steps) {
    EXPECT_TRUE(be->moe({.moe = *id, .x = xt.row_slice(t0, n), .out = out.row_slice(t0, n)}).is_ok());
    t0 += n;
  }
  return to_host(*be, out.tensor());
}

TEST(CpuMoe, MatchesNaiveReference) {
  for (auto [f, bits] : std::vector<std::pair<WeightFormat, int>>{{WeightFormat::kF32, 0},
                                                                  {WeightFormat::kBF16, 0},
                                                                  {WeightFormat::kAffine, 4},
                                                                  {WeightFormat::kAffine, 3}}) {
    std::mt19937 rng(40);
    const MoeCase c = make_case(rng, f, bits);
    const int64_t rows = 7;
    const auto x = test::random_vector(rng, static_cast<size_t>(rows * c.hidden));
    for (bool renorm : {true, false}) {
      const auto out = run(c, x, rows, {rows}, 2, renorm);
      EXPECT_LT(test::rel_err(out, naive_moe(c, x, rows, renorm)), 1e-5)
          << weight_format_name(f) << " bits " << bits << " renorm " << renorm;
    }
  }
}

TEST(CpuMoe, RowExactAndThreadIndependent) {
  std::mt19937 rng(41);
  const MoeCase c = make_case(rng, WeightFormat::kAffine, 6);
  const int64_t rows = 8;
  const auto x = test::random_vector(rng, static_cast<size_t>(rows * c.hidden));
  const auto one = run(c, x, rows, std::vector<int64_t>(8, 1), 1, true);
  for (const auto& steps : std::vector<std::vector<int64_t>>{{8}, {3, 5}, {2, 2, 4}}) {
    for (int threads : {1, 2, 4}) {
      EXPECT_TRUE(test::bitwise_equal(run(c, x, rows, steps, threads, true), one)) << threads << " threads";
    }
  }
}

// Steps of 16 rows and more take blocks of weight rows (cpu::dot_block), here with partial blocks in every
// product (widths 72, 40 and 56): the same bits as one-row steps, and the reference.
TEST(CpuMoe, BlockedStepsEqualOneRowSteps) {
  std::mt19937 rng(42);
  const MoeCase c = make_case(rng, WeightFormat::kBF16, 0, 72, 40, 56);
  const int64_t rows = 40;
  const auto x = test::random_vector(rng, static_cast<size_t>(rows * c.hidden));
  const auto one = run(c, x, rows, std::vector<int64_t>(rows, 1), 1, true);
  EXPECT_LT(test::rel_err(one, naive_moe(c, x, rows, true)), 1e-5);
  for (const auto& steps : std::vector<std::vector<int64_t>>{{40}, {17, 23}}) {
    for (int threads : {1, 3}) {
      EXPECT_TRUE(test::bitwise_equal(run(c, x, rows, steps, threads, true), one)) << threads << " threads";
    }
  }
}

// With an input norm, the block reads rms_norm(x), bitwise as rms_norm() then the block; out may then alias x
// (the decoder layer's residual add), and the scratch is checked.
TEST(CpuMoe, InputNormEqualsRmsNormThenMoe) {
  std::mt19937 rng(42);
  const MoeCase c = make_case(rng, WeightFormat::kBF16, 0);
  const int64_t rows = 3;
  const auto x = test::random_vector(rng, static_cast<size_t>(rows * c.hidden));
  auto be = test::cpu_backend(2);
  const MoeId id = be->bind_moe(c.weights(), {.num_experts_per_tok = c.top_k}).value();
  const VectorId w = be->bind_vector(test::random_vector(rng, static_cast<size_t>(c.hidden)), "norm").value();
  Buffer h = device_tensor(*be, DType::kF32, rows, c.hidden, x),
         h2 = device_tensor(*be, DType::kF32, rows, c.hidden, x);
  Buffer u = be->alloc(DType::kF32, rows, c.hidden).value();
  ASSERT_TRUE(be->moe({.moe = id,
                       .x = h.tensor(),
                       .norm = {.weight = w, .eps = 1e-6f, .scratch = u.tensor()},
                       .out = h.tensor(),
                       .accum = Accum::kAdd})
                  .is_ok());
  ASSERT_TRUE(be->rms_norm({.x = h2.tensor(), .weight = w, .eps = 1e-6f, .out = u.tensor()}).is_ok());
  ASSERT_TRUE(be->moe({.moe = id, .x = u.tensor(), .out = h2.tensor(), .accum = Accum::kAdd}).is_ok());
  EXPECT_TRUE(test::bitwise_equal(to_host(*be, h.tensor()), to_host(*be, h2.tensor())));
  EXPECT_FALSE(be->moe({.moe = id, .x = h.tensor(), .out = h.tensor()}).is_ok()) << "aliasing without a norm";
  const Status alias =
      be->moe({.moe = id, .x = h.tensor(), .norm = {.weight = w, .scratch = h.tensor()}, .out = h2.tensor()});
  EXPECT_NE(alias.message().find("norm.scratch aliases"), std::string::npos) << alias.message();
  const Status shape = be->moe(
      {.moe = id, .x = h.tensor(), .norm = {.weight = w, .scratch = u.row_slice(0, 2)}, .out = h2.tensor()});
  EXPECT_NE(shape.message().find("norm.scratch is [2, 64]"), std::string::npos) << shape.message();
}

}  // namespace
}  // namespace pd
