// gated_delta_net against a naive double-precision reference of spec §5 (causal conv + SiLU, l2norm, gates,
// delta rule token by token, gated RMSNorm): the recurrence (decode/verify steps) with its per-row snapshots,
// row-exactness and thread independence; the chunked prefill form (spec §5.7) against the same reference and
// the recurrence, and its chunking invariance (pieces split at multiples of 64 positions give the bits of one
// piece, whatever the first position and the thread count).
#include <gtest/gtest.h>

#include "puredrive/backend/cpu/gdn_test_util.h"

namespace pd {
namespace {

using test::device_tensor;
using test::GdnCase;
using test::GdnPiece;
using test::GdnRun;

constexpr GdnDims kSmall{
    .num_k_heads = 2, .num_v_heads = 4, .k_head_dim = 16, .v_head_dim = 8, .conv_kernel = 4, .eps = 1e-6f};

GdnCase make_case(std::mt19937& rng, int64_t tokens, const GdnDims& dims = kSmall, float decay = 1.0f) {
  return test::make_gdn_case(rng, tokens, dims, decay);
}

struct NaiveResult {
  std::vector<double> out;    // [T, Hv * Dv]
  std::vector<double> state;  // [Hv, Dk * Dv] after the last token
};

NaiveResult naive_gdn(const GdnCase& c) {
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
  NaiveResult res;
  std::vector<double>& S = res.state;
  S.assign(static_cast<size_t>(hv * dk * dv), 0.0);
  res.out.resize(static_cast<size_t>(T * hv * dv));
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
        res.out[static_cast<size_t>((t * hv + h) * dv + j)] =
            c.norm[static_cast<size_t>(j)] * o[j] * inv *
            silu(c.z[static_cast<size_t>((t * hv + h) * dv + j)]);
      }
    }
  }
  return res;
}

GdnRun run(const GdnCase& c, const std::vector<GdnPiece>& pieces, int threads) {
  return test::run_gdn(*test::cpu_backend(threads), c, pieces);
}

std::vector<GdnPiece> recurrence_steps(std::initializer_list<int64_t> rows) {
  return test::gdn_pieces(rows, false);
}

// The naive reference's conv state: the last Kc-1 inputs, oldest first.
std::vector<double> last_inputs(const GdnCase& c) {
  const int64_t C = c.channels(), keep = c.dims.conv_kernel - 1;
  std::vector<double> v;
  for (int64_t t = c.tokens - keep; t < c.tokens; ++t) {
    for (int64_t ch = 0; ch < C; ++ch) v.push_back(c.qkv[static_cast<size_t>(t * C + ch)]);
  }
  return v;
}

TEST(CpuGatedDeltaNet, MatchesNaiveReference) {
  std::mt19937 rng(30);
  const GdnCase c = make_case(rng, 19);
  const GdnRun r = run(c, recurrence_steps({4, 1, 8, 6}), 2);
  EXPECT_LT(test::rel_err(r.out, naive_gdn(c).out), 1e-5);
}

TEST(CpuGatedDeltaNet, SnapshotsRowExactnessThreads) {
  std::mt19937 rng(31);
  const GdnCase c = make_case(rng, 16);
  const GdnRun one = run(c, std::vector<GdnPiece>(16, {.rows = 1, .prefill = false}), 1);
  // The live state after the last token equals the last snapshot.
  EXPECT_TRUE(test::bitwise_equal(one.conv, one.conv_after.back()));
  EXPECT_TRUE(test::bitwise_equal(one.recurrent, one.recurrent_after.back()));
  for (const auto& steps : std::vector<std::vector<GdnPiece>>{
           recurrence_steps({8, 8}), recurrence_steps({2, 3, 4, 5, 2}), recurrence_steps({7, 1, 8})}) {
    for (int threads : {1, 2, 4}) {
      const GdnRun r = run(c, steps, threads);
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

// Shapes for the chunked form: GQA with Dk != Dv either way, one head, fast-forgetting heads (decays under
// e^-50 flushed) and long-memory ones; 150 tokens end in a partial chunk.
struct ChunkedShape {
  GdnDims dims;
  float decay;
};
const ChunkedShape kChunkedShapes[] = {
    {kSmall, 1.0f},
    {kSmall, 10.0f},
    {kSmall, 0.01f},
    {{.num_k_heads = 2, .num_v_heads = 4, .k_head_dim = 32, .v_head_dim = 16, .conv_kernel = 4, .eps = 1e-6f},
     0.02f},
    {{.num_k_heads = 1, .num_v_heads = 1, .k_head_dim = 16, .v_head_dim = 40, .conv_kernel = 3, .eps = 1e-6f},
     0.05f},
    {{.num_k_heads = 1, .num_v_heads = 3, .k_head_dim = 64, .v_head_dim = 64, .conv_kernel = 4, .eps = 1e-6f},
     0.005f},
};

// Tolerances of the chunked form (different summation order, fp32) against the double-precision recurrence
// (max |a - ref| / max |ref|, outputs and the final state) and against the fp32 recurrence.
constexpr double kChunkedTolerance = 1e-5;

TEST(CpuGatedDeltaNet, ChunkedPrefillMatchesTheRecurrence) {
  std::mt19937 rng(32);
  for (const ChunkedShape& shape : kChunkedShapes) {
    const GdnDims& d = shape.dims;
    SCOPED_TRACE(fmt::format("Hk {} Hv {} Dk {} Dv {} Kc {} decay {}", d.num_k_heads, d.num_v_heads,
                             d.k_head_dim, d.v_head_dim, d.conv_kernel, shape.decay));
    const GdnCase c = make_case(rng, 150, d, shape.decay);
    const NaiveResult ref = naive_gdn(c);
    const GdnRun rec = run(c, recurrence_steps({150}), 2);
    // From position 0: two full chunks and a partial one; from position 37 (after 37 decode rows): chunks
    // [37, 64), [64, 128), [128, 150).
    for (const std::vector<GdnPiece>& pieces :
         {std::vector<GdnPiece>{{150, true}}, std::vector<GdnPiece>{{37, false}, {113, true}}}) {
      SCOPED_TRACE(fmt::format("prefill from position {}", pieces.front().prefill ? 0 : 37));
      const GdnRun r = run(c, pieces, 2);
      std::printf("chunked vs double: out %.3g state %.3g; fp32 recurrence vs double: out %.3g state %.3g\n",
                  test::rel_err(r.out, ref.out), test::rel_err(r.recurrent, ref.state),
                  test::rel_err(rec.out, ref.out), test::rel_err(rec.recurrent, ref.state));
      EXPECT_LT(test::rel_err(r.out, ref.out), kChunkedTolerance);
      EXPECT_LT(test::rel_err(r.recurrent, ref.state), kChunkedTolerance);
      EXPECT_LT(test::rel_err(r.out, std::vector<double>(rec.out.begin(), rec.out.end())), kChunkedTolerance);
      EXPECT_LT(test::rel_err(r.recurrent, std::vector<double>(rec.recurrent.begin(), rec.recurrent.end())),
                kChunkedTolerance);
      EXPECT_TRUE(test::bitwise_equal(r.conv, rec.conv)) << "the conv is shared with the recurrence";
      EXPECT_EQ(test::rel_err(r.conv, last_inputs(c)), 0.0);
    }
  }
}

TEST(CpuGatedDeltaNet, ChunkedPrefillIsChunkingInvariant) {
  std::mt19937 rng(33);
  for (const ChunkedShape& shape : {kChunkedShapes[2], kChunkedShapes[5]}) {
    const GdnCase c = make_case(rng, 300, shape.dims, shape.decay);
    // Pieces split at multiples of 64, from position 0 and after 37 decode rows; the last piece partial.
    const std::vector<std::vector<GdnPiece>> from0 = {
        {{300, true}},
        {{128, true}, {172, true}},
        {{64, true}, {64, true}, {64, true}, {64, true}, {44, true}}};
    const std::vector<std::vector<GdnPiece>> from37 = {
        {{37, false}, {263, true}},
        {{37, false}, {91, true}, {172, true}},
        {{37, false}, {27, true}, {64, true}, {64, true}, {64, true}, {44, true}}};
    for (const auto* runs : {&from0, &from37}) {
      const GdnRun one = run(c, runs->front(), 1);
      for (size_t i = 0; i < runs->size(); ++i) {
        for (int threads : {1, 2, 3}) {
          SCOPED_TRACE(
              fmt::format("split {} of {}, {} threads", i, runs == &from0 ? "from 0" : "from 37", threads));
          const GdnRun r = run(c, (*runs)[i], threads);
          EXPECT_TRUE(test::bitwise_equal(r.out, one.out));
          EXPECT_TRUE(test::bitwise_equal(r.conv, one.conv));
          EXPECT_TRUE(test::bitwise_equal(r.recurrent, one.recurrent));
        }
      }
    }
    // A split that is not at a multiple of 64 changes the chunks: close, but (almost surely) other bits, so
    // the invariance above is not vacuous.
    const GdnRun one = run(c, from0.front(), 1);
    const GdnRun odd = run(c, {{100, true}, {200, true}}, 1);
    EXPECT_FALSE(test::bitwise_equal(odd.recurrent, one.recurrent));
    EXPECT_LT(test::rel_err(odd.out, std::vector<double>(one.out.begin(), one.out.end())), kChunkedTolerance);
  }
}

TEST(CpuGatedDeltaNet, PrefillArgumentsAreChecked) {
  std::mt19937 rng(34);
  const GdnCase c = make_case(rng, 4);
  auto be = test::cpu_backend(1);
  const GdnDims& d = c.dims;
  const int64_t C = c.channels(), vd = c.value_dim();
  Buffer qkv = device_tensor(*be, DType::kF32, 4, C, c.qkv);
  Buffer z = device_tensor(*be, DType::kF32, 4, vd, c.z);
  Buffer b = device_tensor(*be, DType::kF32, 4, 4, c.b);
  Buffer out = be->alloc(DType::kF32, 4, vd).value();
  Buffer conv = be->alloc(DType::kF32, d.conv_kernel - 1, C).value();
  Buffer rec = be->alloc(DType::kF32, 4, c.state_size()).value();
  Buffer sconv = be->alloc(DType::kF32, 8, (d.conv_kernel - 1) * C).value();
  Buffer srec = be->alloc(DType::kF32, 8, 4 * c.state_size()).value();
  GatedDeltaNetArgs args{.dims = d,
                         .qkv = qkv.tensor(),
                         .z = z.tensor(),
                         .b = b.tensor(),
                         .a = b.tensor(),
                         .conv1d = be->bind_vector(c.conv1d, "conv1d").value(),
                         .A_log = be->bind_vector(c.A_log, "A_log").value(),
                         .dt_bias = be->bind_vector(c.dt_bias, "dt_bias").value(),
                         .norm = be->bind_vector(c.norm, "norm").value(),
                         .state = {.conv = conv.tensor(), .recurrent = rec.tensor()},
                         .snapshots = {.conv = sconv.tensor(), .recurrent = srec.tensor()},
                         .out = out.tensor(),
                         .prefill = true,
                         .position = 0};
  Status s = be->gated_delta_net(args);
  EXPECT_NE(s.to_string().find("snapshots"), std::string::npos) << s.to_string();
  args.snapshots = {};
  args.position = -1;
  s = be->gated_delta_net(args);
  EXPECT_NE(s.to_string().find("position -1"), std::string::npos) << s.to_string();
  args.position = 5;
  EXPECT_TRUE(be->gated_delta_net(args).is_ok());
}

}  // namespace
}  // namespace pd
