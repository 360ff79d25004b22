// gated_attention against a naive double-precision reference (q/k RMSNorm, partial NeoX RoPE, GQA, causal
// softmax over the cache, sigmoid gate), over multi-row steps; row-exactness and thread independence.
#include <gtest/gtest.h>

#include "puredrive/backend/cpu/test_util.h"

namespace pd {
namespace {

using test::device_tensor;
using test::to_host;

struct AttnCase {
  AttentionDims dims;
  int64_t tokens;
  std::vector<float> qg, k, v, q_norm, k_norm;  // [T, ...]
};

AttnCase make_attn_case(std::mt19937& rng, int64_t tokens) {
  AttnCase c;
  c.dims = {.num_heads = 4,
            .num_kv_heads = 2,
            .head_dim = 32,
            .rotary_dim = 8,
            .rope_theta = 10000.0,
            .eps = 1e-6f};
  c.tokens = tokens;
  const int64_t q = 4 * 32, kv = 2 * 32;
  c.qg = test::random_vector(rng, static_cast<size_t>(tokens * 2 * q));
  c.k = test::random_vector(rng, static_cast<size_t>(tokens * kv));
  c.v = test::random_vector(rng, static_cast<size_t>(tokens * kv));
  c.q_norm = test::random_vector(rng, 32, 0.3f);
  c.k_norm = test::random_vector(rng, 32, 0.3f);
  for (float& x : c.q_norm) x += 1.0f;
  for (float& x : c.k_norm) x += 1.0f;
  return c;
}

double bf16_round(double x) {
  return bf16_to_f32(f32_to_bf16(static_cast<float>(x)));
}

// Reference: every token attends to tokens [0, t].
std::vector<double> naive_attention(const AttnCase& c, bool bf16_cache) {
  const AttentionDims& d = c.dims;
  const int D = d.head_dim, hq = d.num_heads, hkv = d.num_kv_heads, half = d.rotary_dim / 2;
  const int64_t T = c.tokens;
  auto norm_rope = [&](const float* x, const std::vector<float>& w, int64_t pos, double* out) {
    double ss = 0;
    for (int i = 0; i < D; ++i) ss += double{x[i]} * x[i];
    const double inv = 1.0 / std::sqrt(ss / D + d.eps);
    for (int i = 0; i < D; ++i) out[i] = x[i] * inv * w[static_cast<size_t>(i)];
    for (int i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos) * std::pow(d.rope_theta, -2.0 * i / d.rotary_dim);
      const double lo = out[i], hi = out[i + half];
      out[i] = lo * std::cos(angle) - hi * std::sin(angle);
      out[i + half] = hi * std::cos(angle) + lo * std::sin(angle);
    }
  };
  std::vector<double> keys(static_cast<size_t>(T * hkv * D)), values(keys.size());
  for (int64_t t = 0; t < T; ++t) {
    for (int h = 0; h < hkv; ++h) {
      double* kk = keys.data() + (t * hkv + h) * D;
      norm_rope(c.k.data() + (t * hkv + h) * D, c.k_norm, t, kk);
      for (int i = 0; i < D; ++i) {
        double vv = c.v[static_cast<size_t>((t * hkv + h) * D + i)];
        if (bf16_cache) {
          kk[i] = bf16_round(kk[i]);
          vv = bf16_round(vv);
        }
        values[static_cast<size_t>((t * hkv + h) * D + i)] = vv;
      }
    }
  }
  std::vector<double> out(static_cast<size_t>(T * hq * D));
  std::vector<double> q(static_cast<size_t>(D));
  for (int64_t t = 0; t < T; ++t) {
    for (int h = 0; h < hq; ++h) {
      norm_rope(c.qg.data() + (t * hq + h) * 2 * D, c.q_norm, t, q.data());
      const int kvh = h / (hq / hkv);
      std::vector<double> p(static_cast<size_t>(t + 1));
      double mx = -1e300;
      for (int64_t s = 0; s <= t; ++s) {
        double dot = 0;
        for (int i = 0; i < D; ++i)
          dot += q[static_cast<size_t>(i)] * keys[static_cast<size_t>((s * hkv + kvh) * D + i)];
        p[static_cast<size_t>(s)] = dot / std::sqrt(static_cast<double>(D));
        mx = std::max(mx, p[static_cast<size_t>(s)]);
      }
      double sum = 0;
      for (double& x : p) sum += (x = std::exp(x - mx));
      for (int i = 0; i < D; ++i) {
        double acc = 0;
        for (int64_t s = 0; s <= t; ++s)
          acc += p[static_cast<size_t>(s)] / sum * values[static_cast<size_t>((s * hkv + kvh) * D + i)];
        const double gate = c.qg[static_cast<size_t>((t * hq + h) * 2 * D + D + i)];
        out[static_cast<size_t>((t * hq + h) * D + i)] = acc / (1.0 + std::exp(-gate));
      }
    }
  }
  return out;
}

struct RunResult {
  std::vector<float> out, cache_k, cache_v;
};

// Runs the sequence through the op in steps of the given sizes (as prefill pieces with `prefill`).
RunResult run(const AttnCase& c, const std::vector<int64_t>& steps, int threads, DType cache_dtype,
              bool prefill = false) {
  auto be = test::cpu_backend(threads);
  const AttentionDims& d = c.dims;
  const int64_t q = int64_t{d.num_heads} * d.head_dim, kv = int64_t{d.num_kv_heads} * d.head_dim;
  const VectorId qn = be->bind_vector(c.q_norm, "q_norm").value();
  const VectorId kn = be->bind_vector(c.k_norm, "k_norm").value();
  Buffer ck = be->alloc(cache_dtype, c.tokens + 5, kv).value();
  Buffer cv = be->alloc(cache_dtype, c.tokens + 5, kv).value();
  Buffer qg = device_tensor(*be, DType::kF32, c.tokens, 2 * q, c.qg);
  Buffer k = device_tensor(*be, DType::kF32, c.tokens, kv, c.k);
  Buffer v = device_tensor(*be, DType::kF32, c.tokens, kv, c.v);
  Buffer out = device_tensor<float>(*be, DType::kF32, c.tokens, q, {});
  int64_t t0 = 0;
  for (int64_t n : steps) {
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r) pos[static_cast<size_t>(r)] = static_cast<int32_t>(t0 + r);
    Buffer pt = device_tensor(*be, DType::kI32, n, 1, pos);
    const Status s = be->gated_attention({.dims = d,
                                          .qg = qg.row_slice(t0, n),
                                          .k = k.row_slice(t0, n),
                                          .v = v.row_slice(t0, n),
                                          .q_norm = qn,
                                          .k_norm = kn,
                                          .positions = pt.tensor(),
                                          .cache = {.k = ck.tensor(), .v = cv.tensor()},
                                          .out = out.row_slice(t0, n),
                                          .prefill = prefill});
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    t0 += n;
  }
  RunResult r;
  r.out = to_host(*be, out.tensor());
  const size_t bytes = static_cast<size_t>(ck.nbytes());
  r.cache_k.resize(bytes / 4 + 1);
  r.cache_v.resize(bytes / 4 + 1);
  EXPECT_TRUE(be->download(r.cache_k.data(), ck.tensor()).is_ok());
  EXPECT_TRUE(be->download(r.cache_v.data(), cv.tensor()).is_ok());
  return r;
}

TEST(CpuAttention, MatchesNaiveReference) {
  std::mt19937 rng(20);
  const AttnCase c = make_attn_case(rng, 70);  // crosses the 64-entry conversion block
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const RunResult r = run(c, {5, 1, 60, 4}, 2, dt);
    const double err = test::rel_err(r.out, naive_attention(c, dt == DType::kBF16));
    EXPECT_LT(err, dt == DType::kF32 ? 2e-6 : 2e-3) << dtype_name(dt);
  }
}

TEST(CpuAttention, RowExactAndThreadIndependent) {
  std::mt19937 rng(21);
  const AttnCase c = make_attn_case(rng, 24);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const RunResult one = run(c, std::vector<int64_t>(24, 1), 1, dt);
    for (const auto& steps : std::vector<std::vector<int64_t>>{{8, 8, 8}, {2, 3, 4, 5, 6, 4}, {24}}) {
      for (int threads : {1, 2, 4}) {
        const RunResult r = run(c, steps, threads, dt);
        EXPECT_TRUE(test::bitwise_equal(r.out, one.out)) << threads << " threads, " << dtype_name(dt);
        EXPECT_TRUE(test::bitwise_equal(r.cache_k, one.cache_k));
        EXPECT_TRUE(test::bitwise_equal(r.cache_v, one.cache_v));
      }
    }
  }
}

// Prefill pieces take blocks of 64 rows x 64 cache entries: against the reference, and bitwise the same
// whatever the pieces (docs/DESIGN.md §4.6), here across several row and entry blocks and with pieces that
// start inside a block.
TEST(CpuAttention, PrefillPiecesMatchTheReferenceAndEachOther) {
  std::mt19937 rng(23);
  const AttnCase c = make_attn_case(rng, 150);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const RunResult one = run(c, {150}, 1, dt, true);
    EXPECT_LT(test::rel_err(one.out, naive_attention(c, dt == DType::kBF16)), dt == DType::kF32 ? 2e-6 : 2e-3)
        << dtype_name(dt);
    for (const auto& steps : std::vector<std::vector<int64_t>>{{64, 86}, {3, 61, 64, 22}, {1, 100, 49}}) {
      for (int threads : {1, 3}) {
        const RunResult r = run(c, steps, threads, dt, true);
        EXPECT_TRUE(test::bitwise_equal(r.out, one.out)) << threads << " threads, " << dtype_name(dt);
        EXPECT_TRUE(test::bitwise_equal(r.cache_k, one.cache_k));
      }
    }
  }
}

TEST(CpuAttention, PositionOutsideCacheIsAnError) {
  std::mt19937 rng(22);
  auto be = test::cpu_backend(1);
  const AttnCase c = make_attn_case(rng, 1);
  const VectorId qn = be->bind_vector(c.q_norm, "q_norm").value();
  Buffer ck = be->alloc(DType::kF32, 4, 64).value(), cv = be->alloc(DType::kF32, 4, 64).value();
  Buffer qg = device_tensor(*be, DType::kF32, 1, 256, c.qg), k = device_tensor(*be, DType::kF32, 1, 64, c.k);
  Buffer out = be->alloc(DType::kF32, 1, 128).value();
  Buffer pt = device_tensor(*be, DType::kI32, 1, 1, std::vector<int32_t>{4});
  const Status s = be->gated_attention({.dims = c.dims,
                                        .qg = qg.tensor(),
                                        .k = k.tensor(),
                                        .v = k.tensor(),
                                        .q_norm = qn,
                                        .k_norm = qn,
                                        .positions = pt.tensor(),
                                        .cache = {.k = ck.tensor(), .v = cv.tensor()},
                                        .out = out.tensor()});
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("position 4"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace pd
