// Every op of the CUDA backend against the CPU backend (the numerical reference, itself tested against naive
// double-precision implementations) and against an independent double-precision product for matmul; and
// row-exactness on the GPU: every row of an R-row call equals the one-row call bitwise. Step capture (CUDA
// graphs) against eager execution. Attention has its own file, cuda_attention_test.cpp. Skipped without a
// GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <random>

#include "cuda/cuda_test_util.h"
#include "puredrive/backend/cpu/test_util.h"
#include "puredrive/backend/cuda/cuda_backend.h"
#include "puredrive/backend/cuda/kernels.h"

namespace pd {
namespace {

using cudatest::describe;
using cudatest::download;
using cudatest::FormatCase;
using cudatest::make_moe;
using cudatest::MoeFixture;
using cudatest::rel_err;
using cudatest::rows_of;
using cudatest::same_bits;
using test::device_tensor;

// The independent reference of the products: out[r][n] = sum_k x[r][k] * w[n][k] in double precision over
// the decoded weights w [N, K], plus base[r][n] when base is given.
std::vector<float> double_product(const std::vector<float>& x, const std::vector<float>& w, int R, int64_t N,
                                  int64_t K, const std::vector<float>* base = nullptr) {
  std::vector<float> out(static_cast<size_t>(R * N));
  for (int r = 0; r < R; ++r) {
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) {
        s += static_cast<double>(x[static_cast<size_t>(r * K + k)]) * w[static_cast<size_t>(n * K + k)];
      }
      const size_t i = static_cast<size_t>(r * N + n);
      out[i] = static_cast<float>(s + (base != nullptr ? (*base)[i] : 0.0f));
    }
  }
  return out;
}

TEST(CudaBackend, MissingDeviceIsAClearError) {
  Expected<std::unique_ptr<Backend>> b = create_backend({.name = "cuda"});
  if (b.has_value()) {
    EXPECT_EQ((*b)->device(), Device::kCuda);
    EXPECT_NE((*b)->name().find("cuda"), std::string::npos);
    std::printf("CUDA backend: %s\n", (*b)->name().c_str());
    return;
  }
  const std::string msg = b.status().to_string();
  EXPECT_NE(msg.find("no usable CUDA device"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--backend cpu"), std::string::npos) << msg;
  std::printf("no GPU here, as expected on CI: %s\n", msg.c_str());
}

class CudaOps : public cudatest::GpuAndCpu {
 protected:
  std::mt19937 rng_{1234};
};

TEST_F(CudaOps, MatmulEveryFormatRowExact) {
  std::vector<FormatCase> cases = {{WeightFormat::kF32}, {WeightFormat::kF16}, {WeightFormat::kBF16}};
  for (int bits : {2, 3, 4, 5, 6, 7, 8}) cases.push_back({WeightFormat::kAffine, bits, 32});
  cases.push_back({WeightFormat::kAffine, 4, 64, DType::kF16});
  cases.push_back({WeightFormat::kAffine, 6, 128, DType::kF32});
  cases.push_back({WeightFormat::kAffine, 8, 64});
  const std::vector<int64_t> ks =
      cudatest::quick() ? std::vector<int64_t>{256} : std::vector<int64_t>{64, 256, 2048, 4096};
  // R > kMaxRows (11, 70) runs the tensor-core prefill kernel: checked against the references within its
  // tolerance (kMmaTolerance), not bitwise.
  const std::vector<int> rs = cudatest::quick() ? std::vector<int>{1, 11} : std::vector<int>{1, 3, 8, 11, 70};
  for (const FormatCase& f : cases) {
    for (int64_t K : ks) {
      if (f.format == WeightFormat::kAffine && K % f.group != 0) continue;
      SCOPED_TRACE(fmt::format("{} K={}", describe(f), K));
      const int64_t N = 37;
      auto w = test::make_matrix(rng_, N, K, f.format, f.bits, f.group, 0.5f, f.scale_dtype);
      const MatrixId wc = cpu_->bind_matrix(w->m).value();
      const MatrixId wg = gpu_->bind_matrix(w->m).value();
      for (int R : rs) {
        const std::vector<float> x = test::random_vector(rng_, static_cast<size_t>(R * K));
        const std::vector<float> init = test::random_vector(rng_, static_cast<size_t>(R * N));
        for (Accum acc : {Accum::kOverwrite, Accum::kAdd}) {
          Buffer xc = device_tensor(*cpu_, DType::kF32, R, K, x),
                 oc = device_tensor(*cpu_, DType::kF32, R, N, init);
          Buffer xg = device_tensor(*gpu_, DType::kF32, R, K, x),
                 og = device_tensor(*gpu_, DType::kF32, R, N, init);
          ASSERT_TRUE(cpu_->matmul({.w = wc, .x = xc.tensor(), .out = oc.tensor(), .accum = acc}).is_ok());
          ASSERT_TRUE(gpu_->matmul({.w = wg, .x = xg.tensor(), .out = og.tensor(), .accum = acc}).is_ok());
          const std::vector<float> got = download<float>(*gpu_, og.tensor());
          // bf16 weights of a width divisible by 64 run on the tensor cores at every R (gemv_mma.cu), and
          // so do affine 4-, 6- and 8-bit ones of the streamed widths with 2-byte scales (gemv_stream.cu)
          // up to kMaxRows rows; f32 scales take the CUDA-core kernels.
          const bool streamed_affine =
              f.format == WeightFormat::kAffine && (f.bits == 4 || f.bits == 6 || f.bits == 8) &&
              f.scale_dtype != DType::kF32 && (K == 512 || K == 1024 || K == 2048 || K == 4096);
          const bool mma = (f.format == WeightFormat::kBF16 && K % 64 == 0) || streamed_affine;
          const double tol = R <= cuda::kMaxRows && !mma ? 1e-5 : cudatest::kMmaTolerance;
          EXPECT_LE(rel_err(got, download<float>(*cpu_, oc.tensor())), tol) << "R=" << R;
          const std::vector<float> ref =
              double_product(x, w->reference, R, N, K, acc == Accum::kAdd ? &init : nullptr);
          EXPECT_LE(rel_err(got, ref), tol) << "R=" << R << " vs double reference";
          // Row-exact up to kMaxRows rows: each row equals its one-row call.
          for (int r = 0; r < (R <= cuda::kMaxRows ? R : 0); ++r) {
            Buffer x1 = device_tensor(*gpu_, DType::kF32, 1, K, rows_of(x, K, r, 1));
            Buffer o1 = device_tensor(*gpu_, DType::kF32, 1, N, rows_of(init, N, r, 1));
            ASSERT_TRUE(gpu_->matmul({.w = wg, .x = x1.tensor(), .out = o1.tensor(), .accum = acc}).is_ok());
            EXPECT_TRUE(same_bits(download<float>(*gpu_, o1.tensor()), rows_of(got, N, r, 1)))
                << "row " << r << " of R=" << R;
          }
        }
      }
    }
  }
}

// Products of the formats and widths the streamed kernels take (gemv_stream.cu: bf16, affine 8-bit with
// each group size and 2-byte scale dtype, 6- and 4-bit), with enough weight rows that every SM streams
// several tiles and its ring of stages wraps around: against a double-precision product of the weights, every
// row of an 8-row call equal to its one-row call, and a stacked launch (matmuls, the last matrix ending
// inside a tile) bitwise equal to one launch per matrix.
TEST_F(CudaOps, StreamedProductsRowExact) {
  const FormatCase formats[] = {{WeightFormat::kBF16},
                                {WeightFormat::kAffine, 8, 64, DType::kBF16},
                                {WeightFormat::kAffine, 8, 32, DType::kF16},
                                {WeightFormat::kAffine, 8, 128, DType::kBF16},
                                {WeightFormat::kAffine, 6, 64, DType::kBF16},
                                {WeightFormat::kAffine, 4, 128, DType::kF16}};
  for (const FormatCase& fc : formats) {
    for (const int64_t K : {int64_t{512}, int64_t{1024}, int64_t{2048}, int64_t{4096}}) {
      SCOPED_TRACE(fmt::format("{} K={}", describe(fc), K));
      const int64_t N = 16 * 132 * 8 + 7;
      auto w = test::make_matrix(rng_, N, K, fc.format, fc.bits, fc.group, 0.5f, fc.scale_dtype);
      auto w2 = test::make_matrix(rng_, 45, K, fc.format, fc.bits, fc.group, 0.5f, fc.scale_dtype);
      const MatrixId wg = gpu_->bind_matrix(w->m).value(), wg2 = gpu_->bind_matrix(w2->m).value();
      const int R = cuda::kMaxRows;
      const std::vector<float> x = test::random_vector(rng_, static_cast<size_t>(R * K));
      Buffer xg = device_tensor(*gpu_, DType::kF32, R, K, x);
      Buffer og = device_tensor(*gpu_, DType::kF32, R, N, std::vector<float>{});
      ASSERT_TRUE(gpu_->matmul({.w = wg, .x = xg.tensor(), .out = og.tensor()}).is_ok());
      const std::vector<float> got = download<float>(*gpu_, og.tensor());
      EXPECT_LE(rel_err(got, double_product(x, w->reference, R, N, K)), cudatest::kMmaTolerance);
      for (int r = 0; r < R; ++r) {
        Buffer x1 = device_tensor(*gpu_, DType::kF32, 1, K, rows_of(x, K, r, 1));
        Buffer o1 = device_tensor(*gpu_, DType::kF32, 1, N, std::vector<float>{});
        ASSERT_TRUE(gpu_->matmul({.w = wg, .x = x1.tensor(), .out = o1.tensor()}).is_ok());
        EXPECT_TRUE(same_bits(download<float>(*gpu_, o1.tensor()), rows_of(got, N, r, 1))) << "row " << r;
      }
      Buffer f1 = device_tensor(*gpu_, DType::kF32, R, N, std::vector<float>{});
      Buffer f2 = device_tensor(*gpu_, DType::kF32, R, 45, std::vector<float>{});
      Buffer s2 = device_tensor(*gpu_, DType::kF32, R, 45, std::vector<float>{});
      ASSERT_TRUE(gpu_->matmul({.w = wg2, .x = xg.tensor(), .out = s2.tensor()}).is_ok());
      const std::vector<MatmulTarget> targets = {{wg, f1.tensor()}, {wg2, f2.tensor()}};
      ASSERT_TRUE(gpu_->matmuls({.x = xg.tensor(), .targets = targets}).is_ok());
      EXPECT_TRUE(same_bits(download<float>(*gpu_, f1.tensor()), got));
      EXPECT_TRUE(same_bits(download<float>(*gpu_, f2.tensor()), download<float>(*gpu_, s2.tensor())));
    }
  }
}

// matmuls (one launch for several matrices of one format and width) gives bitwise what matmul gives for
// each target; mixed formats fall back to one launch per matrix with the same results.
TEST_F(CudaOps, MatmulsEqualMatmulPerTarget) {
  const std::vector<std::vector<FormatCase>> groups = {
      {{WeightFormat::kBF16}, {WeightFormat::kBF16}, {WeightFormat::kBF16}, {WeightFormat::kBF16}},
      {{WeightFormat::kAffine, 6, 64}, {WeightFormat::kAffine, 6, 64}},
      {{WeightFormat::kF32}, {WeightFormat::kF16}, {WeightFormat::kAffine, 8, 32}}};
  const std::vector<int64_t> widths = {37, 5, 1, 64};
  for (const int64_t K : {int64_t{256}, int64_t{2048}}) {
    for (const std::vector<FormatCase>& g : groups) {
      std::vector<std::unique_ptr<test::OwnedMatrix>> ws;
      std::vector<MatrixId> ids;
      for (size_t i = 0; i < g.size(); ++i) {
        ws.push_back(test::make_matrix(rng_, widths[i], K, g[i].format, g[i].bits, g[i].group));
        ids.push_back(gpu_->bind_matrix(ws.back()->m).value());
      }
      for (const int R : {1, 3, 8}) {
        SCOPED_TRACE(fmt::format("{} K={} R={} matrices={}", describe(g[0]), K, R, g.size()));
        const std::vector<float> x = test::random_vector(rng_, static_cast<size_t>(R * K));
        Buffer xg = device_tensor(*gpu_, DType::kF32, R, K, x);
        std::vector<Buffer> fused, single;
        std::vector<MatmulTarget> targets;
        for (size_t i = 0; i < g.size(); ++i) {
          fused.push_back(device_tensor(*gpu_, DType::kF32, R, widths[i], std::vector<float>{}));
          single.push_back(device_tensor(*gpu_, DType::kF32, R, widths[i], std::vector<float>{}));
          targets.push_back({ids[i], fused.back().tensor()});
          ASSERT_TRUE(gpu_->matmul({.w = ids[i], .x = xg.tensor(), .out = single.back().tensor()}).is_ok());
        }
        ASSERT_TRUE(gpu_->matmuls({.x = xg.tensor(), .targets = targets}).is_ok());
        for (size_t i = 0; i < g.size(); ++i) {
          EXPECT_TRUE(same_bits(download<float>(*gpu_, fused[i].tensor()),
                                download<float>(*gpu_, single[i].tensor())))
              << "target " << i;
        }
      }
    }
  }
}

TEST_F(CudaOps, EmbedRmsNormAddArgmax) {
  const int64_t V = 50, H = 96;
  for (const FormatCase& f : {FormatCase{WeightFormat::kBF16}, FormatCase{WeightFormat::kAffine, 6, 32}}) {
    auto table = test::make_matrix(rng_, V, H, f.format, f.bits, f.group);
    const MatrixId tc = cpu_->bind_matrix(table->m).value(), tg = gpu_->bind_matrix(table->m).value();
    const std::vector<int32_t> ids = {3, 0, 49, 3, 17};
    Buffer ic = device_tensor(*cpu_, DType::kI32, 5, 1, ids),
           ig = device_tensor(*gpu_, DType::kI32, 5, 1, ids);
    Buffer ec = device_tensor(*cpu_, DType::kF32, 5, H, std::vector<float>{});
    Buffer eg = device_tensor(*gpu_, DType::kF32, 5, H, std::vector<float>{});
    ASSERT_TRUE(cpu_->embed({.table = tc, .tokens = ic.tensor(), .out = ec.tensor()}).is_ok());
    ASSERT_TRUE(gpu_->embed({.table = tg, .tokens = ig.tensor(), .out = eg.tensor()}).is_ok());
    EXPECT_TRUE(same_bits(download<float>(*gpu_, eg.tensor()), download<float>(*cpu_, ec.tensor())))
        << describe(f);
  }
  // RMSNorm in place and into a column slice.
  const int R = 6;
  const std::vector<float> x = test::random_vector(rng_, static_cast<size_t>(R * H));
  const std::vector<float> w = test::random_vector(rng_, static_cast<size_t>(H));
  const VectorId wc = cpu_->bind_vector(w, "w").value(), wg = gpu_->bind_vector(w, "w").value();
  Buffer xc = device_tensor(*cpu_, DType::kF32, R, H, x), xg = device_tensor(*gpu_, DType::kF32, R, H, x);
  Buffer wide = device_tensor(*gpu_, DType::kF32, R, 2 * H, std::vector<float>{});
  ASSERT_TRUE(
      gpu_->rms_norm({.x = xg.tensor(), .weight = wg, .eps = 1e-6f, .out = wide.tensor().col_slice(H, H)})
          .is_ok());
  ASSERT_TRUE(cpu_->rms_norm({.x = xc.tensor(), .weight = wc, .eps = 1e-6f, .out = xc.tensor()}).is_ok());
  ASSERT_TRUE(gpu_->rms_norm({.x = xg.tensor(), .weight = wg, .eps = 1e-6f, .out = xg.tensor()}).is_ok());
  const std::vector<float> nc = download<float>(*cpu_, xc.tensor()), ng = download<float>(*gpu_, xg.tensor());
  EXPECT_LE(rel_err(ng, nc), 1e-6);
  EXPECT_TRUE(same_bits(download<float>(*gpu_, wide.tensor().col_slice(H, H)), ng));
  for (int r = 0; r < R; ++r) {
    Buffer x1 = device_tensor(*gpu_, DType::kF32, 1, H, rows_of(x, H, r, 1));
    ASSERT_TRUE(gpu_->rms_norm({.x = x1.tensor(), .weight = wg, .eps = 1e-6f, .out = x1.tensor()}).is_ok());
    EXPECT_TRUE(same_bits(download<float>(*gpu_, x1.tensor()), rows_of(ng, H, r, 1))) << "row " << r;
  }
  // add
  const std::vector<float> y = test::random_vector(rng_, static_cast<size_t>(R * H));
  Buffer yg = device_tensor(*gpu_, DType::kF32, R, H, y);
  Buffer x2 = device_tensor(*gpu_, DType::kF32, R, H, x);
  ASSERT_TRUE(gpu_->add({.a = x2.tensor(), .b = yg.tensor(), .out = x2.tensor()}).is_ok());
  const std::vector<float> sum = download<float>(*gpu_, x2.tensor());
  for (size_t i = 0; i < sum.size(); ++i) ASSERT_EQ(sum[i], x[i] + y[i]);
  // argmax: ties to the lowest index, NaN never wins, all -inf gives the first; a short row (one block) and
  // a vocabulary-sized one (many slices, the tie in different slices).
  for (const int N : {3000, 248320}) {
    std::vector<float> logits(static_cast<size_t>(4 * N));
    for (float& v : logits) v = std::uniform_real_distribution<float>(-5, 5)(rng_);
    logits[100] = 9.0f;
    logits[static_cast<size_t>(N - 100)] = 9.0f;  // tie: 100 wins
    logits[static_cast<size_t>(N + 7)] = NAN;
    logits[static_cast<size_t>(N + 8)] = 7.0f;                                       // NaN skipped
    for (int i = 0; i < N; ++i) logits[static_cast<size_t>(2 * N + i)] = -INFINITY;  // all -inf: 0
    logits[static_cast<size_t>(3 * N + N - 1)] = 100.0f;                             // last element
    Buffer lc = device_tensor(*cpu_, DType::kF32, 4, N, logits),
           lg = device_tensor(*gpu_, DType::kF32, 4, N, logits);
    Buffer ac = device_tensor(*cpu_, DType::kI32, 4, 1, std::vector<int32_t>{});
    Buffer ag = device_tensor(*gpu_, DType::kI32, 4, 1, std::vector<int32_t>{});
    ASSERT_TRUE(cpu_->argmax({.x = lc.tensor(), .out = ac.tensor()}).is_ok());
    ASSERT_TRUE(gpu_->argmax({.x = lg.tensor(), .out = ag.tensor()}).is_ok());
    const std::vector<int32_t> want = download<int32_t>(*cpu_, ac.tensor());
    EXPECT_EQ(download<int32_t>(*gpu_, ag.tensor()), want) << N;
    EXPECT_EQ(want, (std::vector<int32_t>{100, 8, 0, N - 1})) << N;
  }
}

struct GdnCase {
  GdnDims dims;
};

TEST_F(CudaOps, GatedDeltaNetMatchesCpuAndIsRowExact) {
  const std::vector<GdnCase> cases = {{{.num_k_heads = 2,
                                        .num_v_heads = 4,
                                        .k_head_dim = 16,
                                        .v_head_dim = 16,
                                        .conv_kernel = 4,
                                        .eps = 1e-6f}},
                                      {{.num_k_heads = 16,
                                        .num_v_heads = 32,
                                        .k_head_dim = 128,
                                        .v_head_dim = 128,
                                        .conv_kernel = 4,
                                        .eps = 1e-6f}},
                                      // A conv of other than 4 taps takes the kernels' long windows.
                                      {{.num_k_heads = 2,
                                        .num_v_heads = 4,
                                        .k_head_dim = 16,
                                        .v_head_dim = 16,
                                        .conv_kernel = 6,
                                        .eps = 1e-6f}}};
  for (const GdnCase& c : cases) {
    const GdnDims& d = c.dims;
    SCOPED_TRACE(fmt::format("Dk={} Kc={}", d.k_head_dim, d.conv_kernel));
    const int64_t C = 2 * int64_t{d.num_k_heads} * d.k_head_dim + int64_t{d.num_v_heads} * d.v_head_dim;
    const int64_t vd = int64_t{d.num_v_heads} * d.v_head_dim;
    const int64_t S = vd * d.k_head_dim;
    const int kc = d.conv_kernel;
    std::vector<float> conv1d = test::random_vector(rng_, static_cast<size_t>(C * kc), 0.5f);
    std::vector<float> a_log(static_cast<size_t>(d.num_v_heads)), dt_bias(a_log.size());
    for (size_t i = 0; i < a_log.size(); ++i) {
      a_log[i] = std::log(std::uniform_real_distribution<float>(1.0f, 16.0f)(rng_));
      dt_bias[i] = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng_);
    }
    std::vector<float> norm = test::random_vector(rng_, static_cast<size_t>(d.v_head_dim), 0.1f);
    for (float& x : norm) x += 1.0f;
    struct Ids {
      VectorId conv1d, a_log, dt_bias, norm;
    };
    auto bind = [&](Backend& be) {
      return Ids{be.bind_vector(conv1d, "conv1d").value(), be.bind_vector(a_log, "A_log").value(),
                 be.bind_vector(dt_bias, "dt_bias").value(), be.bind_vector(norm, "norm").value()};
    };
    const Ids ic = bind(*cpu_), ig = bind(*gpu_);
    const int total = 3 + 8;
    const std::vector<float> qkv = test::random_vector(rng_, static_cast<size_t>(total * C));
    const std::vector<float> z = test::random_vector(rng_, static_cast<size_t>(total * vd));
    const std::vector<float> b = test::random_vector(rng_, static_cast<size_t>(total * d.num_v_heads));
    const std::vector<float> a = test::random_vector(rng_, static_cast<size_t>(total * d.num_v_heads));
    struct State {
      Buffer conv, rec, snap_conv, snap_rec;
    };
    auto make_state = [&](Backend& be) {
      return State{be.alloc(DType::kF32, kc - 1, C).value(),
                   be.alloc(DType::kF32, d.num_v_heads, S / d.num_v_heads).value(),
                   be.alloc(DType::kF32, 8, (kc - 1) * C).value(), be.alloc(DType::kF32, 8, S).value()};
    };
    auto run = [&](Backend& be, const Ids& ids, State& st, int begin, int n, bool snaps) {
      Buffer bqkv = device_tensor(be, DType::kF32, n, C, rows_of(qkv, C, begin, n));
      Buffer bz = device_tensor(be, DType::kF32, n, vd, rows_of(z, vd, begin, n));
      Buffer bb = device_tensor(be, DType::kF32, n, d.num_v_heads, rows_of(b, d.num_v_heads, begin, n));
      Buffer ba = device_tensor(be, DType::kF32, n, d.num_v_heads, rows_of(a, d.num_v_heads, begin, n));
      Buffer out = device_tensor(be, DType::kF32, n, vd, std::vector<float>{});
      GdnSnapshots sn;
      if (snaps) sn = {.conv = st.snap_conv.tensor(), .recurrent = st.snap_rec.tensor()};
      const Status s = be.gated_delta_net({.dims = d,
                                           .qkv = bqkv.tensor(),
                                           .z = bz.tensor(),
                                           .b = bb.tensor(),
                                           .a = ba.tensor(),
                                           .conv1d = ids.conv1d,
                                           .A_log = ids.a_log,
                                           .dt_bias = ids.dt_bias,
                                           .norm = ids.norm,
                                           .state = {.conv = st.conv.tensor(), .recurrent = st.rec.tensor()},
                                           .snapshots = sn,
                                           .out = out.tensor()});
      EXPECT_TRUE(s.is_ok()) << s.to_string();
      return download<float>(be, out.tensor());
    };
    auto state_of = [&](Backend& be, const State& st) {
      std::vector<float> v = download<float>(be, st.conv.tensor());
      const std::vector<float> r = download<float>(be, st.rec.tensor());
      v.insert(v.end(), r.begin(), r.end());
      return v;
    };
    for (int R = 1; R <= 8; ++R) {
      State sc = make_state(*cpu_), sg = make_state(*gpu_), s1 = make_state(*gpu_);
      run(*cpu_, ic, sc, 0, 3, false);
      run(*gpu_, ig, sg, 0, 3, false);
      for (int i = 0; i < 3; ++i) run(*gpu_, ig, s1, i, 1, false);
      const std::vector<float> oc = run(*cpu_, ic, sc, 3, R, true);
      const std::vector<float> og = run(*gpu_, ig, sg, 3, R, true);
      EXPECT_LE(rel_err(og, oc), 1e-4) << "R=" << R;
      EXPECT_LE(rel_err(state_of(*gpu_, sg), state_of(*cpu_, sc)), 1e-4) << "state R=" << R;
      const std::vector<float> snap_conv = download<float>(*gpu_, sg.snap_conv.tensor());
      const std::vector<float> snap_rec = download<float>(*gpu_, sg.snap_rec.tensor());
      for (int r = 0; r < R; ++r) {
        const std::vector<float> o = run(*gpu_, ig, s1, 3 + r, 1, false);
        EXPECT_TRUE(same_bits(o, rows_of(og, vd, r, 1))) << "R=" << R << " row " << r;
        EXPECT_TRUE(
            same_bits(download<float>(*gpu_, s1.conv.tensor()), rows_of(snap_conv, (kc - 1) * C, r, 1)))
            << "conv snapshot R=" << R << " row " << r;
        EXPECT_TRUE(same_bits(download<float>(*gpu_, s1.rec.tensor()), rows_of(snap_rec, S, r, 1)))
            << "recurrent snapshot R=" << R << " row " << r;
      }
      EXPECT_TRUE(same_bits(state_of(*gpu_, s1), state_of(*gpu_, sg))) << "final state R=" << R;
    }
  }
}

// The decode step's cluster holds every value head of a key head: more than 8 per key head is refused with a
// clear error before anything runs, and the state is left as it was.
TEST_F(CudaOps, GatedDeltaNetRefusesMoreThanEightValueHeadsPerKeyHead) {
  const GdnDims d{
      .num_k_heads = 1, .num_v_heads = 9, .k_head_dim = 16, .v_head_dim = 16, .conv_kernel = 4, .eps = 1e-6f};
  const int64_t C = 2 * int64_t{d.k_head_dim} + int64_t{d.num_v_heads} * d.v_head_dim;
  const int64_t vd = int64_t{d.num_v_heads} * d.v_head_dim;
  const VectorId conv1d =
      gpu_->bind_vector(std::vector<float>(static_cast<size_t>(C * 4), 0.5f), "c").value();
  const VectorId a_log = gpu_->bind_vector(std::vector<float>(9, 0.0f), "a").value();
  const VectorId dt_bias = gpu_->bind_vector(std::vector<float>(9, 0.0f), "d").value();
  const VectorId norm = gpu_->bind_vector(std::vector<float>(16, 1.0f), "n").value();
  const std::vector<float> rec0(static_cast<size_t>(vd * d.k_head_dim), 0.25f);
  Buffer qkv = device_tensor(*gpu_, DType::kF32, 1, C, std::vector<float>(static_cast<size_t>(C), 1.0f));
  Buffer z = device_tensor(*gpu_, DType::kF32, 1, vd, std::vector<float>(static_cast<size_t>(vd), 1.0f));
  Buffer b = device_tensor(*gpu_, DType::kF32, 1, 9, std::vector<float>(9, 0.0f));
  Buffer a = device_tensor(*gpu_, DType::kF32, 1, 9, std::vector<float>(9, 0.0f));
  Buffer conv = device_tensor(*gpu_, DType::kF32, 3, C, std::vector<float>(static_cast<size_t>(3 * C), 0.5f));
  Buffer rec = device_tensor(*gpu_, DType::kF32, 9, vd * d.k_head_dim / 9, rec0);
  Buffer out = device_tensor(*gpu_, DType::kF32, 1, vd, std::vector<float>{});
  const Status s = gpu_->gated_delta_net({.dims = d,
                                          .qkv = qkv.tensor(),
                                          .z = z.tensor(),
                                          .b = b.tensor(),
                                          .a = a.tensor(),
                                          .conv1d = conv1d,
                                          .A_log = a_log,
                                          .dt_bias = dt_bias,
                                          .norm = norm,
                                          .state = {.conv = conv.tensor(), .recurrent = rec.tensor()},
                                          .snapshots = {},
                                          .out = out.tensor()});
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported);
  EXPECT_NE(s.to_string().find("up to 8 value heads per key head"), std::string::npos) << s.to_string();
  EXPECT_EQ(download<float>(*gpu_, rec.tensor()), rec0);
}

TEST_F(CudaOps, MoeMatchesCpuAndIsRowExact) {
  struct Case {
    int experts, top_k;
    int64_t hidden, inter;
    FormatCase g, u, dn;
    FormatCase router = {WeightFormat::kBF16};  // and the shared-expert gate
    std::optional<FormatCase> shared = {};      // the shared expert's own format (else the experts')
  };
  const std::vector<Case> cases = {
      {8, 2, 64, 32, {WeightFormat::kF32}, {WeightFormat::kF32}, {WeightFormat::kF32}},
      {8,
       2,
       64,
       32,
       {WeightFormat::kAffine, 6, 32},
       {WeightFormat::kAffine, 4, 32},
       {WeightFormat::kAffine, 8, 32}},
      {64, 8, 256, 128, {WeightFormat::kBF16}, {WeightFormat::kBF16}, {WeightFormat::kBF16}},
      // The real model's widths: decode steps stream the experts (moe_stream_up.cu, moe_stream_down.cu), bf16
      // or affine 4-, 6- or 8-bit with an 8-bit router (the quantization recipes' rule).
      {64, 8, 2048, 512, {WeightFormat::kBF16}, {WeightFormat::kBF16}, {WeightFormat::kBF16}},
      {64,
       8,
       2048,
       512,
       {WeightFormat::kAffine, 8, 64},
       {WeightFormat::kAffine, 8, 64},
       {WeightFormat::kAffine, 8, 64},
       {WeightFormat::kAffine, 8, 64}},
      {32,
       4,
       1024,
       512,
       {WeightFormat::kAffine, 8, 32, DType::kF16},
       {WeightFormat::kAffine, 8, 32, DType::kF16},
       {WeightFormat::kAffine, 8, 32, DType::kF16},
       {WeightFormat::kAffine, 8, 32, DType::kF16}},
      {64,
       8,
       2048,
       512,
       {WeightFormat::kAffine, 6, 64},
       {WeightFormat::kAffine, 6, 64},
       {WeightFormat::kAffine, 6, 64},
       {WeightFormat::kAffine, 8, 64}},
      // More router outputs than two per gate/up block (Qwen3-Next has 512 experts, top-10): the blocks
      // compute them in several pairs (moe_stream_up.cu, router_slices) on GPUs of up to 150 SMs.
      {300,
       10,
       512,
       512,
       {WeightFormat::kAffine, 8, 64},
       {WeightFormat::kAffine, 8, 64},
       {WeightFormat::kAffine, 8, 64},
       {WeightFormat::kAffine, 8, 64}},
      // The oq6e recipe: routed experts 6-bit, the shared expert 8-bit.
      {64,
       8,
       2048,
       512,
       {WeightFormat::kAffine, 6, 64},
       {WeightFormat::kAffine, 6, 64},
       {WeightFormat::kAffine, 6, 64},
       {WeightFormat::kAffine, 8, 64},
       FormatCase{WeightFormat::kAffine, 8, 64}},
      {32,
       4,
       1024,
       512,
       {WeightFormat::kAffine, 4, 32, DType::kF16},
       {WeightFormat::kAffine, 4, 32, DType::kF16},
       {WeightFormat::kAffine, 4, 32, DType::kF16},
       {WeightFormat::kAffine, 8, 64}}};
  for (const Case& c : cases) {
    if (cudatest::small() && &c != &cases.front()) break;
    SCOPED_TRACE(fmt::format("E={} k={} {}", c.experts, c.top_k, describe(c.g)));
    MoeFixture f =
        make_moe(rng_, c.experts, c.hidden, c.inter, c.g, c.u, c.dn, 0,
                 c.shared.value_or(FormatCase{WeightFormat::kBF16}), c.shared.has_value(), c.router);
    const MoeSpec spec{.num_experts_per_tok = c.top_k, .norm_topk_prob = true};
    const MoeId mc = cpu_->bind_moe(f.w, spec).value(), mg = gpu_->bind_moe(f.w, spec).value();
    for (int R : cudatest::small() ? std::vector<int>{1, 8, 11} : std::vector<int>{1, 2, 5, 8, 11, 70}) {
      const std::vector<float> x = test::random_vector(rng_, static_cast<size_t>(R * c.hidden));
      Buffer xc = device_tensor(*cpu_, DType::kF32, R, c.hidden, x),
             xg = device_tensor(*gpu_, DType::kF32, R, c.hidden, x);
      Buffer oc = device_tensor(*cpu_, DType::kF32, R, c.hidden, std::vector<float>{});
      Buffer og = device_tensor(*gpu_, DType::kF32, R, c.hidden, std::vector<float>{});
      ASSERT_TRUE(cpu_->moe({.moe = mc, .x = xc.tensor(), .out = oc.tensor()}).is_ok());
      ASSERT_TRUE(gpu_->moe({.moe = mg, .x = xg.tensor(), .out = og.tensor()}).is_ok());
      const std::vector<float> got = download<float>(*gpu_, og.tensor());
      // Wide steps run the grouped prefill path, whose activations carry 16 significant bits into both
      // products (kernels.h): over the real model's 2048-wide sums it measured 1.2e-4 from the CPU (H200).
      const double tol = R <= cuda::kMaxRows ? 1e-4 : 3e-4;
      EXPECT_LE(rel_err(got, download<float>(*cpu_, oc.tensor())), tol) << "R=" << R;
      for (int r = 0; r < R; ++r) {
        Buffer x1 = device_tensor(*gpu_, DType::kF32, 1, c.hidden, rows_of(x, c.hidden, r, 1));
        Buffer o1 = device_tensor(*gpu_, DType::kF32, 1, c.hidden, std::vector<float>{});
        ASSERT_TRUE(gpu_->moe({.moe = mg, .x = x1.tensor(), .out = o1.tensor()}).is_ok());
        const std::vector<float> one = download<float>(*gpu_, o1.tensor());
        if (R <= cuda::kMaxRows) {
          EXPECT_TRUE(same_bits(one, rows_of(got, c.hidden, r, 1))) << "R=" << R << " row " << r;
        } else {
          // Wide steps (grouped tensor-core prefill path): within tolerance of the one-row (decode) result.
          EXPECT_LE(rel_err(rows_of(got, c.hidden, r, 1), one), tol) << "R=" << R << " row " << r;
        }
      }
    }
  }
}

// One "step": upload x, matmul, rms_norm, argmax. Recorded steps (graph capture, then replays) give the
// bits of eager execution; a download inside a step runs what was recorded and continues eagerly.
TEST_F(CudaOps, StepCaptureMatchesEager) {
  const int64_t K = 256, N = 300;
  const int R = 3;
  auto w = test::make_matrix(rng_, N, K, WeightFormat::kBF16);
  const MatrixId wg = gpu_->bind_matrix(w->m).value();
  const std::vector<float> ones(static_cast<size_t>(N), 1.0f);
  const VectorId nv = gpu_->bind_vector(ones, "ones").value();
  Buffer x = gpu_->alloc(DType::kF32, R, K).value(), y = gpu_->alloc(DType::kF32, R, N).value();
  Buffer idx = gpu_->alloc(DType::kI32, R, 1).value();
  auto step = [&](const std::vector<float>& host, bool capture, bool download_inside) {
    if (capture) {
      EXPECT_TRUE(gpu_->begin_step().is_ok());
    }
    EXPECT_TRUE(gpu_->upload(x.tensor(), host.data()).is_ok());
    EXPECT_TRUE(gpu_->matmul({.w = wg, .x = x.tensor(), .out = y.tensor()}).is_ok());
    std::vector<float> mid;
    if (download_inside) mid = download<float>(*gpu_, y.tensor());
    EXPECT_TRUE(gpu_->rms_norm({.x = y.tensor(), .weight = nv, .eps = 1e-6f, .out = y.tensor()}).is_ok());
    EXPECT_TRUE(gpu_->argmax({.x = y.tensor(), .out = idx.tensor()}).is_ok());
    if (capture) {
      EXPECT_TRUE(gpu_->end_step().is_ok());
    }
    std::vector<float> out = download<float>(*gpu_, y.tensor());
    const std::vector<int32_t> ids = download<int32_t>(*gpu_, idx.tensor());
    out.insert(out.end(), ids.begin(), ids.end());  // ids compared as bits too
    return out;
  };
  // A recorded step during which the upload staging or a scratch buffer grows runs eagerly (a graph would
  // keep the old address): one recorded step first, so that every recorded step below replays a graph.
  step(test::random_vector(rng_, static_cast<size_t>(R * K)), true, false);
  const CudaStepStats before = cuda_step_stats(*gpu_).value();
  for (int i = 0; i < 4; ++i) {
    const std::vector<float> host = test::random_vector(rng_, static_cast<size_t>(R * K));
    const std::vector<float> eager = step(host, false, false);
    EXPECT_TRUE(same_bits(step(host, true, false), eager)) << "recorded step " << i;
    EXPECT_TRUE(same_bits(step(host, true, true), eager)) << "step with a download inside " << i;
  }
  const CudaStepStats after = cuda_step_stats(*gpu_).value();
  if (std::getenv("PD_CUDA_GRAPHS") == nullptr) {
    EXPECT_LE(after.graphs_captured - before.graphs_captured, 1);  // 0 when the warm-up step captured it
    EXPECT_EQ(after.graph_replays - before.graph_replays, 4);
    EXPECT_GE(after.eager_steps - before.eager_steps, 4);
  }
}

}  // namespace
}  // namespace pd
