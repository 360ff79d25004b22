// The canonical dot product (both code paths, one order) and row dequantisation in every stored format.
#include "puredrive/backend/cpu/kernels.h"

#include <gtest/gtest.h>

#include "puredrive/backend/cpu/test_util.h"

namespace pd {
namespace {

TEST(Kernels, DotPathsAreBitwiseEqualAndAccurate) {
  std::mt19937 rng(1);
  for (int64_t n : {0, 1, 7, 8, 9, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 1000, 2048, 2051}) {
    const auto a = test::random_vector(rng, static_cast<size_t>(n));
    const auto b = test::random_vector(rng, static_cast<size_t>(n));
    const float fast = cpu::dot(a.data(), b.data(), n);
    const float portable = cpu::dot_portable(a.data(), b.data(), n);
    EXPECT_EQ(std::memcmp(&fast, &portable, sizeof(float)), 0)
        << "n=" << n << " " << fast << " vs " << portable;
    double ref = 0, mag = 0;
    for (int64_t i = 0; i < n; ++i) {
      ref += static_cast<double>(a[static_cast<size_t>(i)]) * b[static_cast<size_t>(i)];
      mag += std::abs(static_cast<double>(a[static_cast<size_t>(i)]) * b[static_cast<size_t>(i)]);
    }
    EXPECT_NEAR(fast, ref, 1e-6 * mag + 1e-30) << "n=" << n;
  }
}

// fma_product: both paths bitwise equal, and each element the sum of its band within rounding, for column
// counts that exercise the 64-, 32- and 8-wide blocks and the scalar tail, full and triangular bands.
TEST(Kernels, FmaProductPathsAreBitwiseEqualAndAccurate) {
  std::mt19937 rng(3);
  for (int cols : {1, 7, 8, 31, 40, 64, 70, 100, 128, 133}) {
    for (int band : {0, 1, 1000}) {
      for (int col_band : {0, 1, 1000}) {
        for (bool accumulate : {false, true}) {
          const int rows = 9, depth = 37;
          const auto a = test::random_vector(rng, static_cast<size_t>(rows * depth));
          const auto b = test::random_vector(rng, static_cast<size_t>(depth * (cols + 3)));
          const auto c0 = test::random_vector(rng, static_cast<size_t>(rows * cols));
          std::vector<float> fast = c0, portable = c0;
          const cpu::FmaOperand A{a.data(), depth}, B{b.data(), cols + 3};
          cpu::fma_product(rows, cols, col_band, depth, band, A, B, fast.data(), cols, accumulate);
          cpu::fma_product_portable(rows, cols, col_band, depth, band, A, B, portable.data(), cols,
                                    accumulate);
          EXPECT_TRUE(test::bitwise_equal(fast, portable)) << cols << " cols, band " << band;
          for (int r = 0; r < rows; ++r) {
            for (int j = 0; j < cols; ++j) {
              const size_t at = static_cast<size_t>(r * cols + j);
              if (j >= std::min(cols, r + col_band)) {
                EXPECT_EQ(fast[at], c0[at]) << "column outside the band was written";
                continue;
              }
              double ref = accumulate ? c0[at] : 0.0, mag = std::abs(ref);
              for (int k = 0; k < std::min(depth, r + band); ++k) {
                const double t = double{a[static_cast<size_t>(r * depth + k)]} *
                                 b[static_cast<size_t>(k * (cols + 3) + j)];
                ref += t;
                mag += std::abs(t);
              }
              EXPECT_NEAR(fast[at], ref, 1e-6 * mag + 1e-30);
            }
          }
        }
      }
    }
  }
}

TEST(Kernels, TwoRowDotEqualsTwoDots) {
  std::mt19937 rng(5);
  for (int64_t n : {1, 7, 32, 45, 64, 96, 1000, 1030}) {
    const auto x0 = test::random_vector(rng, static_cast<size_t>(n));
    const auto x1 = test::random_vector(rng, static_cast<size_t>(n));
    const auto w = test::random_vector(rng, static_cast<size_t>(n));
    float a = 0, b = 0;
    cpu::dot2(x0.data(), x1.data(), w.data(), n, &a, &b);
    const float ra = cpu::dot(x0.data(), w.data(), n), rb = cpu::dot(x1.data(), w.data(), n);
    EXPECT_EQ(std::memcmp(&a, &ra, 4), 0) << "n=" << n;
    EXPECT_EQ(std::memcmp(&b, &rb, 4), 0) << "n=" << n;
  }
}

TEST(Kernels, FusedBf16DotEqualsConvertThenDot) {
  std::mt19937 rng(4);
  for (int64_t n : {1, 5, 8, 31, 32, 40, 64, 100, 1027}) {
    const auto a = test::random_vector(rng, static_cast<size_t>(n));
    const auto w = test::random_vector(rng, static_cast<size_t>(n));
    std::vector<uint16_t> b(w.size());
    std::vector<float> bf(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      b[i] = f32_to_bf16(w[i]);
      bf[i] = bf16_to_f32(b[i]);
    }
    const float fused = cpu::dot_bf16(a.data(), b.data(), n);
    const float plain = cpu::dot(a.data(), bf.data(), n);
    EXPECT_EQ(std::memcmp(&fused, &plain, sizeof(float)), 0) << "n=" << n;
  }
}

// add_scaled: both paths are the scalar loop's product-then-sum, for f32 and bf16 values.
TEST(Kernels, AddScaledEqualsTheScalarLoop) {
  std::mt19937 rng(6);
  for (int64_t n : {1, 7, 8, 9, 64, 100, 128, 259}) {
    const auto acc0 = test::random_vector(rng, static_cast<size_t>(n));
    const auto v = test::random_vector(rng, static_cast<size_t>(n));
    std::vector<uint16_t> vb(v.size());
    for (size_t i = 0; i < v.size(); ++i) vb[i] = f32_to_bf16(v[i]);
    const float p = 0.37f;
    std::vector<float> ref = acc0, ref_b = acc0, got = acc0, got_b = acc0;
    for (size_t i = 0; i < v.size(); ++i) {
      const volatile float prod = p * v[i], prod_b = p * bf16_to_f32(vb[i]);  // rounded, then added
      ref[i] = ref[i] + prod;
      ref_b[i] = ref_b[i] + prod_b;
    }
    cpu::add_scaled(got.data(), p, v.data(), n);
    cpu::add_scaled_bf16(got_b.data(), p, vb.data(), n);
    EXPECT_TRUE(test::bitwise_equal(got, ref)) << "n=" << n;
    EXPECT_TRUE(test::bitwise_equal(got_b, ref_b)) << "n=" << n;
  }
}

// The prefill softmax: every path gives the bits of its documented loop (scale, max, exponentials summed in
// eight lanes and combined by the fixed tree, division), and a probability vector.
TEST(Kernels, SoftmaxLanesEqualsItsLoop) {
  std::mt19937 rng(9);
  for (int64_t n : {1, 7, 8, 9, 64, 100, 259, 4100}) {
    auto x = test::random_vector(rng, static_cast<size_t>(n));
    for (float& v : x) v *= 40.0f;
    const float scale = 0.0625f;
    std::vector<float> ref = x;
    float mx = -INFINITY;
    for (float& v : ref) {
      v = v * scale;
      mx = std::max(mx, v);
    }
    float l[8] = {};
    for (int64_t t = 0; t < n; ++t) {
      ref[t] = std::exp(ref[t] - mx);
      l[t % 8] = l[t % 8] + ref[t];
    }
    const float sum = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    for (float& v : ref) v = v / sum;
    std::vector<float> got = x;
    cpu::softmax_lanes(got.data(), n, scale);
    EXPECT_TRUE(test::bitwise_equal(got, ref)) << "n=" << n;
    double total = 0;
    for (float v : got) total += v;
    EXPECT_NEAR(total, 1.0, 1e-5) << "n=" << n;
  }
}

// The delta rule's row updates: both paths are the scalar loops, each product and sum rounded on its own.
TEST(Kernels, StateRowUpdatesEqualTheScalarLoops) {
  std::mt19937 rng(8);
  for (int64_t n : {1, 8, 13, 64, 128, 131}) {
    const auto s0 = test::random_vector(rng, static_cast<size_t>(n));
    const auto acc0 = test::random_vector(rng, static_cast<size_t>(n));
    const auto d = test::random_vector(rng, static_cast<size_t>(n));
    const float alpha = 0.93f, c = -0.41f, q = 0.77f;
    std::vector<float> s = s0, acc = acc0, rs = s0, racc = acc0;
    cpu::decay_row(s.data(), alpha, c, acc.data(), n);
    for (size_t j = 0; j < rs.size(); ++j) {
      rs[j] = rs[j] * alpha;
      const volatile float prod = rs[j] * c;  // rounded, then added
      racc[j] = racc[j] + prod;
    }
    EXPECT_TRUE(test::bitwise_equal(s, rs) && test::bitwise_equal(acc, racc)) << "decay_row n=" << n;
    cpu::update_row(s.data(), c, d.data(), q, acc.data(), n);
    for (size_t j = 0; j < rs.size(); ++j) {
      const volatile float step = c * d[j];
      rs[j] = rs[j] + step;
      const volatile float prod = rs[j] * q;
      racc[j] = racc[j] + prod;
    }
    EXPECT_TRUE(test::bitwise_equal(s, rs) && test::bitwise_equal(acc, racc)) << "update_row n=" << n;
  }
}

// dot_block: every weight row of a block gives dot_row's bits, whatever the block's size, for stored and
// dequantised formats, with inputs past one cache slice (8192 columns: slices of 8 inputs), and for one and
// three inputs (the last against bf16 rows in pairs), with and without a tail past the last 32 columns.
TEST(Kernels, DotBlockEqualsDotRow) {
  std::mt19937 rng(7);
  for (WeightFormat f : {WeightFormat::kBF16, WeightFormat::kF32, WeightFormat::kAffine}) {
    for (int64_t cols : {int64_t{96}, int64_t{100}, int64_t{8192}}) {
      for (int64_t count : {int64_t{1}, int64_t{3}, int64_t{21}}) {
        const int64_t rows = 20;
        auto m = test::make_matrix(rng, rows, cols, f, 6, 32);
        std::vector<std::vector<float>> x;
        std::vector<const float*> xs;
        for (int64_t i = 0; i < count; ++i) x.push_back(test::random_vector(rng, static_cast<size_t>(cols)));
        for (const auto& v : x) xs.push_back(v.data());
        std::vector<float> buf(static_cast<size_t>(cpu::kDotBlockRows * cols));
        for (int nb : {1, 4, 5, cpu::kDotBlockRows}) {
          std::vector<float> block(static_cast<size_t>(nb * count)), one(static_cast<size_t>(count));
          cpu::dot_block(m->m, 3, nb, xs.data(), count, block.data(), buf.data());
          for (int i = 0; i < nb; ++i) {
            cpu::dot_row(m->m, 3 + i, xs.data(), count, one.data(), buf.data());
            EXPECT_EQ(std::memcmp(one.data(), block.data() + i * count, static_cast<size_t>(count) * 4), 0)
                << weight_format_name(f) << " " << cols << " columns, " << count << " inputs, block of " << nb
                << ", row " << i;
          }
        }
      }
    }
  }
}

TEST(Kernels, DequantizeEveryFormatExactly) {
  std::mt19937 rng(2);
  struct Case {
    WeightFormat f;
    int bits, gs;
    DType sd;
  };
  std::vector<Case> cases = {{WeightFormat::kF32, 0, 0, DType::kBF16},
                             {WeightFormat::kF16, 0, 0, DType::kBF16},
                             {WeightFormat::kBF16, 0, 0, DType::kBF16}};
  for (int bits = 2; bits <= 8; ++bits) {
    for (int gs : {32, 64, 128}) cases.push_back({WeightFormat::kAffine, bits, gs, DType::kBF16});
  }
  cases.push_back({WeightFormat::kAffine, 4, 64, DType::kF16});
  cases.push_back({WeightFormat::kAffine, 6, 32, DType::kF32});
  for (const Case& c : cases) {
    const int64_t rows = 5, cols = 256;
    auto m = test::make_matrix(rng, rows, cols, c.f, c.bits, c.gs, 0.5f, c.sd);
    std::vector<float> buf(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = cpu::matrix_row(m->m, r, buf.data());
      ASSERT_EQ(std::memcmp(row, m->reference.data() + r * cols, static_cast<size_t>(cols) * 4), 0)
          << weight_format_name(c.f) << " bits " << c.bits << " group " << c.gs << " row " << r;
    }
  }
}

// A one-input dot on an affine row (decoded in registers, not in memory) gives the bits of the canonical dot
// with the dequantised row, for every width and group size, and against a double reference.
TEST(Kernels, AffineDotEqualsDotOfTheDequantisedRow) {
  std::mt19937 rng(9);
  // f32 scales: a bf16 scale times a code is exact in f32, so only they tell a fused multiply-add apart.
  for (int bits = 2; bits <= 8; ++bits) {
    for (int gs : {32, 64, 128}) {
      const int64_t rows = 3, cols = 384;
      auto m = test::make_matrix(rng, rows, cols, WeightFormat::kAffine, bits, gs, 0.5f,
                                 gs == 64 ? DType::kBF16 : DType::kF32);
      const auto x = test::random_vector(rng, static_cast<size_t>(cols));
      const float* xs[1] = {x.data()};
      std::vector<float> buf(static_cast<size_t>(cols));
      for (int64_t r = 0; r < rows; ++r) {
        float fused = 0;
        cpu::dot_row(m->m, r, xs, 1, &fused, buf.data());
        const float plain = cpu::dot(x.data(), m->reference.data() + r * cols, cols);
        EXPECT_EQ(std::memcmp(&fused, &plain, 4), 0) << "bits " << bits << " group " << gs << " row " << r;
        double ref = 0, mag = 0;
        for (int64_t i = 0; i < cols; ++i) {
          const double t =
              double{x[static_cast<size_t>(i)]} * m->reference[static_cast<size_t>(r * cols + i)];
          ref += t;
          mag += std::abs(t);
        }
        EXPECT_NEAR(fused, ref, 1e-6 * mag);
      }
    }
  }
}

TEST(Kernels, AffineCodesStraddlingWords) {
  std::mt19937 rng(3);
  for (int bits : {3, 5, 6, 7}) {
    auto m = test::make_matrix(rng, 2, 64, WeightFormat::kAffine, bits, 32, 0.5f, DType::kF32);
    const float* s = reinterpret_cast<const float*>(m->scales.data());
    const float* b = reinterpret_cast<const float*>(m->biases.data());
    for (int64_t r = 0; r < 2; ++r) {
      for (int64_t j = 0; j < 64; ++j) {
        const int64_t g = r * 2 + j / 32;
        const float w = s[g] * static_cast<float>(cpu::affine_code(m->m, r, j)) + b[g];
        ASSERT_EQ(w, m->reference[static_cast<size_t>(r * 64 + j)]) << "bits " << bits << " j " << j;
      }
    }
  }
}

}  // namespace
}  // namespace pd
