// Input norms (InputNorm) on the GPU: an op given a norm gives bitwise what rms_norm() into a buffer followed
// by the op gives, whether the backend fuses the norm into its kernels (the streamed decode products) or runs
// it first (other formats and widths, prefill, the MoE block). Skipped without a GPU.
#include <gtest/gtest.h>

#include <random>

#include "cuda/cuda_test_util.h"
#include "puredrive/backend/cpu/test_util.h"
#include "puredrive/backend/cuda/kernels.h"

namespace pd {
namespace {

using cudatest::describe;
using cudatest::download;
using cudatest::FormatCase;
using cudatest::make_moe;
using cudatest::MoeFixture;
using cudatest::rel_err;
using cudatest::same_bits;
using test::device_tensor;

class CudaInputNorm : public cudatest::GpuAndCpu {
 protected:
  // Rows of different scales, so that each row's norm matters; a norm weight around 1.
  std::vector<float> rows_of_scales(int R, int64_t K) {
    std::vector<float> x = test::random_vector(rng_, static_cast<size_t>(R * K));
    for (int r = 0; r < R; ++r) {
      for (int64_t k = 0; k < K; ++k)
        x[static_cast<size_t>(r * K + k)] *= 0.25f + 3.0f * static_cast<float>(r);
    }
    return x;
  }
  std::vector<float> norm_weight(int64_t K) {
    std::vector<float> w = test::random_vector(rng_, static_cast<size_t>(K));
    for (float& v : w) v = 1.0f + 0.5f * v;
    return w;
  }
  std::mt19937 rng_{4321};
};

// Streamed widths and formats (fused: bf16, affine 8-bit) and others (norm first: affine 6-bit, f32, width
// 256); decode rows and a prefill step; the input is left unchanged.
TEST_F(CudaInputNorm, MatmulsWithNormEqualNormThenMatmuls) {
  const FormatCase formats[] = {{WeightFormat::kBF16},
                                {WeightFormat::kAffine, 8, 64, DType::kBF16},
                                {WeightFormat::kAffine, 6, 64},
                                {WeightFormat::kF32}};
  for (const FormatCase& fc : formats) {
    for (const int64_t K : {int64_t{256}, int64_t{512}, int64_t{2048}, int64_t{4096}}) {
      auto w1 = test::make_matrix(rng_, 300, K, fc.format, fc.bits, fc.group, 0.5f, fc.scale_dtype);
      auto w2 = test::make_matrix(rng_, 32, K, fc.format, fc.bits, fc.group, 0.5f, fc.scale_dtype);
      const MatrixId g1 = gpu_->bind_matrix(w1->m).value(), g2 = gpu_->bind_matrix(w2->m).value();
      const MatrixId c1 = cpu_->bind_matrix(w1->m).value(), c2 = cpu_->bind_matrix(w2->m).value();
      const std::vector<float> nw = norm_weight(K);
      const VectorId gn = gpu_->bind_vector(nw, "norm").value(), cn = cpu_->bind_vector(nw, "norm").value();
      for (const int R : {1, 3, 8, 11}) {
        const bool prefill = R > cuda::kMaxRows;
        SCOPED_TRACE(fmt::format("{} K={} R={}", describe(fc), K, R));
        const std::vector<float> x = rows_of_scales(R, K);
        auto run = [&](Backend& be, MatrixId a, MatrixId b, VectorId n, bool fused) {
          Buffer xb = device_tensor(be, DType::kF32, R, K, x);
          Buffer u = device_tensor(be, DType::kF32, R, K, std::vector<float>{});
          Buffer o1 = device_tensor(be, DType::kF32, R, 300, std::vector<float>{});
          Buffer o2 = device_tensor(be, DType::kF32, R, 32, std::vector<float>{});
          const std::vector<MatmulTarget> targets = {{a, o1.tensor()}, {b, o2.tensor()}};
          if (fused) {
            EXPECT_TRUE(be.matmuls({.x = xb.tensor(),
                                    .targets = targets,
                                    .norm = {.weight = n, .eps = 1e-6f, .scratch = u.tensor()},
                                    .prefill = prefill})
                            .is_ok());
            EXPECT_TRUE(same_bits(download<float>(be, xb.tensor()), x)) << "the input changed";
          } else {
            EXPECT_TRUE(
                be.rms_norm({.x = xb.tensor(), .weight = n, .eps = 1e-6f, .out = u.tensor()}).is_ok());
            EXPECT_TRUE(be.matmuls({.x = u.tensor(), .targets = targets, .prefill = prefill}).is_ok());
          }
          std::vector<float> out = download<float>(be, o1.tensor());
          const std::vector<float> out2 = download<float>(be, o2.tensor());
          out.insert(out.end(), out2.begin(), out2.end());
          return out;
        };
        const std::vector<float> fused = run(*gpu_, g1, g2, gn, true);
        EXPECT_TRUE(same_bits(fused, run(*gpu_, g1, g2, gn, false))) << "GPU";
        const std::vector<float> cpu = run(*cpu_, c1, c2, cn, true);
        EXPECT_TRUE(same_bits(cpu, run(*cpu_, c1, c2, cn, false))) << "CPU";
        EXPECT_LE(rel_err(fused, cpu), cudatest::kMmaTolerance);
      }
    }
  }
}

// The MoE block as the decoder layer calls it: x is the residual stream, the block adds into it (out aliases
// x), its input is rms_norm(x), which the CUDA backend runs first; decode and prefill kernels, the streamed
// formats (bf16, affine 8-bit at the model's widths) and others.
TEST_F(CudaInputNorm, MoeWithNormEqualsNormThenMoe) {
  struct Case {
    int experts, top_k;
    int64_t hidden, inter;
    FormatCase f;
  };
  const Case cases[] = {{64, 8, 2048, 512, {WeightFormat::kBF16}},
                        {64, 8, 2048, 512, {WeightFormat::kAffine, 8, 64}},
                        {32, 4, 1024, 512, {WeightFormat::kAffine, 8, 32, DType::kF16}},
                        {8, 2, 64, 32, {WeightFormat::kF32}}};
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("E={} H={} {}", c.experts, c.hidden, describe(c.f)));
    const bool affine = c.f.format == WeightFormat::kAffine;
    MoeFixture f = make_moe(rng_, c.experts, c.hidden, c.inter, c.f, c.f, c.f, 0, {WeightFormat::kBF16},
                            false, affine ? c.f : FormatCase{WeightFormat::kBF16});
    const MoeSpec spec{.num_experts_per_tok = c.top_k, .norm_topk_prob = true};
    const MoeId mg = gpu_->bind_moe(f.w, spec).value(), mc = cpu_->bind_moe(f.w, spec).value();
    const std::vector<float> nw = norm_weight(c.hidden);
    const VectorId gn = gpu_->bind_vector(nw, "norm").value(), cn = cpu_->bind_vector(nw, "norm").value();
    for (const int R : {1, 3, 8, 11}) {
      SCOPED_TRACE(fmt::format("R={}", R));
      const std::vector<float> x = rows_of_scales(R, c.hidden);
      auto run = [&](Backend& be, MoeId m, VectorId n, bool fused, bool prefill) {
        Buffer h = device_tensor(be, DType::kF32, R, c.hidden, x);
        Buffer u = device_tensor(be, DType::kF32, R, c.hidden, std::vector<float>{});
        if (fused) {
          EXPECT_TRUE(be.moe({.moe = m,
                              .x = h.tensor(),
                              .norm = {.weight = n, .eps = 1e-6f, .scratch = u.tensor()},
                              .out = h.tensor(),
                              .accum = Accum::kAdd,
                              .prefill = prefill})
                          .is_ok());
        } else {
          EXPECT_TRUE(be.rms_norm({.x = h.tensor(), .weight = n, .eps = 1e-6f, .out = u.tensor()}).is_ok());
          EXPECT_TRUE(
              be.moe({.moe = m, .x = u.tensor(), .out = h.tensor(), .accum = Accum::kAdd, .prefill = prefill})
                  .is_ok());
        }
        return download<float>(be, h.tensor());
      };
      for (const bool prefill : {false, true}) {
        const std::vector<float> fused = run(*gpu_, mg, gn, true, prefill);
        EXPECT_TRUE(same_bits(fused, run(*gpu_, mg, gn, false, prefill))) << "GPU, prefill " << prefill;
        EXPECT_LE(rel_err(fused, run(*cpu_, mc, cn, true, prefill)), 3e-4) << "vs CPU, prefill " << prefill;
      }
    }
  }
}

// The checks of an input norm's scratch: its shape, and no aliasing.
TEST_F(CudaInputNorm, BadScratchIsAClearError) {
  const int64_t K = 512;
  auto w = test::make_matrix(rng_, 64, K, WeightFormat::kBF16, 0, 0, 0.5f);
  const MatrixId wg = gpu_->bind_matrix(w->m).value();
  const VectorId gn = gpu_->bind_vector(norm_weight(K), "norm").value();
  Buffer x = device_tensor(*gpu_, DType::kF32, 3, K, rows_of_scales(3, K));
  Buffer small = device_tensor(*gpu_, DType::kF32, 2, K, std::vector<float>{});
  Buffer out = device_tensor(*gpu_, DType::kF32, 3, 64, std::vector<float>{});
  const std::vector<MatmulTarget> targets = {{wg, out.tensor()}};
  // The fallback (prefill) checks the scratch; so must the fused path, which never writes it.
  for (const bool prefill : {false, true}) {
    const Status wrong = gpu_->matmuls({.x = x.tensor(),
                                        .targets = targets,
                                        .norm = {.weight = gn, .scratch = small.tensor()},
                                        .prefill = prefill});
    EXPECT_FALSE(wrong.is_ok());
    EXPECT_NE(wrong.to_string().find("norm.scratch"), std::string::npos) << wrong.to_string();
    const Status alias = gpu_->matmuls({.x = x.tensor(),
                                        .targets = targets,
                                        .norm = {.weight = gn, .scratch = x.tensor()},
                                        .prefill = prefill});
    EXPECT_FALSE(alias.is_ok());
    EXPECT_NE(alias.to_string().find("aliases"), std::string::npos) << alias.to_string();
  }
}

}  // namespace
}  // namespace pd
