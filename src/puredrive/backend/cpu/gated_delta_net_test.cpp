// gated_delta_net against a naive double-precision reference of spec §5 (causal conv + SiLU, l2norm, gates,
// delta rule, gated RMSNorm); per-row snapshots, row-exactness and thread independence.
#include <gtest/gtest.h>

#include "puredrive/backend/cpu/test_util.h"

namespace pd {
namespace {

using test::device_tensor;
using test::to_host;

struct GdnCase {
  GdnDims dims{
      .num_k_heads = 2, .num_v_heads = 4, .k_head_dim = 16, .v_head_dim = 8, .conv_kernel = 4, .eps = 1e-6f};
  int64_t tokens = 0;
  int64_t channels() const { return 2 * 2 * 16 + 4 * 8; }
  std::vector<float> qkv, z, b, a, conv1d, A_log, dt_bias, norm;
};

GdnCase make_case(std::mt19937& rng, int64_t tokens) {
  GdnCase c;
  c.tokens = tokens;
  const int64_t C = c.channels();
  c.qkv = test::random_vector(rng, static_cast<size_t>(tokens * C));
  c.z = test::random_vector(rng, static_cast<size_t>(tokens * 32));
  c.b = test::random_vector(rng, static_cast<size_t>(tokens * 4));
  c.a = test::random_vector(rng, static_cast<size_t>(tokens * 4));
  c.conv1d = test::random_vector(rng, static_cast<size_t>(C * 4), 0.5f);
  c.A_log = test::random_vector(rng, 4, 0.5f);
  c.dt_bias = test::random_vector(rng, 4, 0.5f);
  c.norm = test::random_vector(rng, 8, 0.2f);
  for (float& x : c.norm) x += 1.0f;
  return c;
}

std::vector<double> naive_gdn(const GdnCase& c) {
  const GdnDims& d = c.dims;
  const int64_t C = c.channels(), T = c.tokens;
  const int K = d.conv_kernel, dk = d.k_head_dim, dv = d.v_head_dim, hv = d.num_v_heads,
            r = hv / d.num_k_heads;
  const int64_t key_dim = int64_t{d.num_k_heads} * dk;
  auto silu = [](double x) { return x / (1.0 + std::exp(-x)); };
  std::vector<double> conv(static_cast<size_t>(T * C));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t ch = 0; ch < C; ++ch) {
      double acc = 0;
      for (int j = 0; j < K; ++j) {
        const int64_t src = t - (K - 1) + j;
        if (src >= 0)
          acc += double{c.conv1d[static_cast<size_t>(ch * K + j)]} * c.qkv[static_cast<size_t>(src * C + ch)];
      }
      conv[static_cast<size_t>(t * C + ch)] = silu(acc);
    }
  }
  std::vector<double> S(static_cast<size_t>(hv * dk * dv), 0.0), out(static_cast<size_t>(T * hv * dv));
  for (int64_t t = 0; t < T; ++t) {
    for (int h = 0; h < hv; ++h) {
      const int kh = h / r;
      std::vector<double> q(dk), k(dk);
      double qs = 0, ks = 0;
      for (int i = 0; i < dk; ++i) {
        q[i] = conv[static_cast<size_t>(t * C + kh * dk + i)];
        k[i] = conv[static_cast<size_t>(t * C + key_dim + kh * dk + i)];
        qs += q[i] * q[i];
        ks += k[i] * k[i];
      }
      for (int i = 0; i < dk; ++i) {
        q[i] = q[i] / std::sqrt(qs + 1e-6) / std::sqrt(static_cast<double>(dk));
        k[i] = k[i] / std::sqrt(ks + 1e-6);
      }
      const double beta = 1.0 / (1.0 + std::exp(-double{c.b[static_cast<size_t>(t * hv + h)]}));
      const double x = double{c.a[static_cast<size_t>(t * hv + h)]} + c.dt_bias[static_cast<size_t>(h)];
      const double g = -std::exp(double{c.A_log[static_cast<size_t>(h)]}) * std::log1p(std::exp(x));
      double* s = S.data() + h * dk * dv;
      for (int i = 0; i < dk * dv; ++i) s[i] *= std::exp(g);
      std::vector<double> o(dv, 0.0);
      for (int j = 0; j < dv; ++j) {
        double m = 0;
        for (int i = 0; i < dk; ++i) m += s[i * dv + j] * k[i];
        const double delta = beta * (conv[static_cast<size_t>(t * C + 2 * key_dim + h * dv + j)] - m);
        for (int i = 0; i < dk; ++i) s[i * dv + j] += k[i] * delta;
        for (int i = 0; i < dk; ++i) o[j] += s[i * dv + j] * q[i];
      }
      double ms = 0;
      for (double v : o) ms += v * v;
      const double inv = 1.0 / std::sqrt(ms / dv + d.eps);
      for (int j = 0; j < dv; ++j) {
        out[static_cast<size_t>((t * hv + h) * dv + j)] =
            c.norm[static_cast<size_t>(j)] * o[j] * inv *
            silu(c.z[static_cast<size_t>((t * hv + h) * dv + j)]);
      }
    }
  }
  return out;
}

struct RunResult {
  std::vector<float> out, conv, recurrent;
  std::vector<std::vector<float>> conv_after, recurrent_after;  // states after every token (from snapshots)
};

RunResult run(const GdnCase& c, const std::vector<int64_t>& steps, int threads) {
  auto be = test::cpu_backend(threads);
  const GdnDims& d = c.dims;
  const int64_t C = c.channels(), vd = 32, st = int64_t{d.k_head_dim} * d.v_head_dim;
  const VectorId conv1d = be->bind_vector(c.conv1d, "conv1d").value();
  const VectorId a_log = be->bind_vector(c.A_log, "A_log").value();
  const VectorId dt = be->bind_vector(c.dt_bias, "dt_bias").value();
  const VectorId norm = be->bind_vector(c.norm, "norm").value();
  Buffer qkv = device_tensor(*be, DType::kF32, c.tokens, C, c.qkv);
  Buffer z = device_tensor(*be, DType::kF32, c.tokens, vd, c.z);
  Buffer b = device_tensor(*be, DType::kF32, c.tokens, 4, c.b);
  Buffer a = device_tensor(*be, DType::kF32, c.tokens, 4, c.a);
  Buffer out = be->alloc(DType::kF32, c.tokens, vd).value();
  Buffer conv = be->alloc(DType::kF32, d.conv_kernel - 1, C).value();
  Buffer rec = be->alloc(DType::kF32, d.num_v_heads, st).value();
  Buffer sconv = be->alloc(DType::kF32, 8, (d.conv_kernel - 1) * C).value();
  Buffer srec = be->alloc(DType::kF32, 8, d.num_v_heads * st).value();
  RunResult res;
  int64_t t0 = 0;
  for (int64_t n : steps) {
    const Status s = be->gated_delta_net({.dims = d,
                                          .qkv = qkv.row_slice(t0, n),
                                          .z = z.row_slice(t0, n),
                                          .b = b.row_slice(t0, n),
                                          .a = a.row_slice(t0, n),
                                          .conv1d = conv1d,
                                          .A_log = a_log,
                                          .dt_bias = dt,
                                          .norm = norm,
                                          .state = {.conv = conv.tensor(), .recurrent = rec.tensor()},
                                          .snapshots = {.conv = sconv.tensor(), .recurrent = srec.tensor()},
                                          .out = out.row_slice(t0, n)});
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    for (int64_t r = 0; r < n; ++r) {
      res.conv_after.push_back(to_host(*be, sconv.row_slice(r, 1)));
      res.recurrent_after.push_back(to_host(*be, srec.row_slice(r, 1)));
    }
    t0 += n;
  }
  res.out = to_host(*be, out.tensor());
  res.conv = to_host(*be, conv.tensor());
  res.recurrent = to_host(*be, rec.tensor());
  return res;
}

TEST(CpuGatedDeltaNet, MatchesNaiveReference) {
  std::mt19937 rng(30);
  const GdnCase c = make_case(rng, 19);
  const RunResult r = run(c, {4, 1, 8, 6}, 2);
  EXPECT_LT(test::rel_err(r.out, naive_gdn(c)), 1e-5);
}

TEST(CpuGatedDeltaNet, SnapshotsRowExactnessThreads) {
  std::mt19937 rng(31);
  const GdnCase c = make_case(rng, 16);
  const RunResult one = run(c, std::vector<int64_t>(16, 1), 1);
  // The live state after the last token equals the last snapshot.
  EXPECT_TRUE(test::bitwise_equal(one.conv, one.conv_after.back()));
  EXPECT_TRUE(test::bitwise_equal(one.recurrent, one.recurrent_after.back()));
  for (const auto& steps : std::vector<std::vector<int64_t>>{{8, 8}, {2, 3, 4, 5, 2}, {7, 1, 8}}) {
    for (int threads : {1, 2, 4}) {
      const RunResult r = run(c, steps, threads);
      EXPECT_TRUE(test::bitwise_equal(r.out, one.out)) << threads << " threads";
      EXPECT_TRUE(test::bitwise_equal(r.conv, one.conv));
      EXPECT_TRUE(test::bitwise_equal(r.recurrent, one.recurrent));
      for (size_t t = 0; t < one.conv_after.size(); ++t) {
        EXPECT_TRUE(test::bitwise_equal(r.conv_after[t], one.conv_after[t])) << "token " << t;
        EXPECT_TRUE(test::bitwise_equal(r.recurrent_after[t], one.recurrent_after[t])) << "token " << t;
      }
    }
  }
}

}  // namespace
}  // namespace pd
