#include "puredrive/checkpoint/affine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace pd {
namespace {

// Plain reference: code j is the bits [j*b, (j+1)*b) of the row read as a little-endian byte stream, gathered
// one bit at a time.
uint32_t reference_code(const std::vector<uint8_t>& bytes, int bits, int64_t j) {
  uint32_t v = 0;
  for (int i = 0; i < bits; ++i) {
    const int64_t bit = j * bits + i;
    v |= static_cast<uint32_t>((bytes[static_cast<size_t>(bit / 8)] >> (bit % 8)) & 1u) << i;
  }
  return v;
}

std::vector<uint8_t> as_bytes(const uint32_t* words, int64_t n) {
  std::vector<uint8_t> b(static_cast<size_t>(n) * 4);
  for (int64_t i = 0; i < n; ++i) {
    for (int k = 0; k < 4; ++k) b[static_cast<size_t>(4 * i + k)] = static_cast<uint8_t>(words[i] >> (8 * k));
  }
  return b;
}

class AffinePack : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(AffinePack, RoundTripAgainstBitByBitReference) {
  const auto [bits, group] = GetParam();
  std::mt19937 rng(bits * 1000 + group);
  for (int64_t cols : {int64_t{group}, int64_t{4 * group}}) {
    std::vector<uint32_t> codes(static_cast<size_t>(cols));
    for (auto& c : codes) c = rng() & ((1u << bits) - 1u);
    // Extreme patterns so every bit position is exercised both ways.
    codes[0] = (1u << bits) - 1u;
    codes[1] = 0;
    std::vector<uint32_t> packed(static_cast<size_t>(affine_packed_cols(cols, bits)));
    ASSERT_EQ(static_cast<int64_t>(packed.size()) * 32, cols * bits);
    pack_affine_row(codes.data(), cols, bits, packed.data());
    const auto bytes = as_bytes(packed.data(), static_cast<int64_t>(packed.size()));
    for (int64_t j = 0; j < cols; ++j) {
      ASSERT_EQ(reference_code(bytes, bits, j), codes[j]) << "bits " << bits << " j " << j;
      ASSERT_EQ(affine_code(packed.data(), bits, j), codes[j]) << "bits " << bits << " j " << j;
    }
  }
}

TEST_P(AffinePack, DequantizeMatchesPlainReference) {
  const auto [bits, group] = GetParam();
  const int64_t rows = 3, cols = 2 * group;
  std::mt19937 rng(7 + bits);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (auto& x : w) x = nd(rng);
  for (DType sd : {DType::kBF16, DType::kF16, DType::kF32}) {
    auto q = quantize_affine(w.data(), rows, cols, bits, group, sd);
    ASSERT_TRUE(q.has_value()) << q.status().message();
    const Matrix m = q->view("w");
    const int64_t groups = cols / group;
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      m.dequantize_row(r, row.data());
      const auto bytes =
          as_bytes(q->codes.data() + r * affine_packed_cols(cols, bits), affine_packed_cols(cols, bits));
      for (int64_t j = 0; j < cols; ++j) {
        const int64_t g = r * groups + j / group;
        const float s = load_scale(q->scales.data(), sd, g);
        const float b = load_scale(q->biases.data(), sd, g);
        const float want = s * static_cast<float>(reference_code(bytes, bits, j)) + b;
        ASSERT_EQ(row[j], want) << "r " << r << " j " << j;
        // The quantizer itself: within half a step plus scale/bias rounding of the original.
        const float tol =
            0.5f * std::fabs(s) + 0.02f * (std::fabs(s) * ((1 << bits) - 1) + std::fabs(b)) + 1e-6f;
        ASSERT_NEAR(row[j], w[static_cast<size_t>(r * cols + j)], tol) << "bits " << bits;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllBitsAndGroups, AffinePack,
                         ::testing::Combine(::testing::Values(2, 3, 4, 5, 6, 8),
                                            ::testing::Values(32, 64, 128)));

TEST(Affine, KnownFourBitLayout) {
  // MLX docs: with 4 bits the first element sits in bits 0-3 of the first word, the second in bits 4-7.
  const uint32_t word = 0x87654321u;
  for (int j = 0; j < 8; ++j) EXPECT_EQ(affine_code(&word, 4, j), static_cast<uint32_t>(j + 1));
  // 3 bits: code 10 spans bits 30-32, i.e. bits 30-31 of word 0 and bit 0 of word 1.
  const uint32_t words[2] = {0x80000000u, 0x1u};
  EXPECT_EQ(affine_code(words, 3, 10), 0b110u);
}

TEST(Affine, RowSliceAndNbytes) {
  std::vector<float> w(8 * 64);
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(static_cast<float>(i));
  auto q = quantize_affine(w.data(), 8, 64, 6, 32, DType::kBF16);
  ASSERT_TRUE(q.has_value());
  const Matrix m = q->view("m");
  EXPECT_EQ(m.nbytes(), 8 * (64 * 6 / 8) + 2 * 8 * 2 * 2);
  const Matrix s = m.row_slice(5, 2);
  EXPECT_EQ(s.rows, 2);
  std::vector<float> a(64), b(64);
  for (int r = 0; r < 2; ++r) {
    m.dequantize_row(5 + r, a.data());
    s.dequantize_row(r, b.data());
    EXPECT_EQ(a, b);
  }
  // Dense views.
  std::vector<uint16_t> bf(6);
  for (int i = 0; i < 6; ++i) bf[i] = f32_to_bf16(static_cast<float>(i) - 2.5f);
  Matrix d;
  d.format = WeightFormat::kBF16;
  d.rows = 3;
  d.cols = 2;
  d.data = bf.data();
  EXPECT_EQ(d.nbytes(), 12);
  float row[2];
  d.row_slice(1, 2).dequantize_row(1, row);
  EXPECT_EQ(row[0], 1.5f);
  EXPECT_EQ(row[1], 2.5f);
}

TEST(Affine, QuantizeRejectsBadParams) {
  std::vector<float> w(64);
  EXPECT_FALSE(quantize_affine(w.data(), 1, 64, 7, 32).has_value());
  EXPECT_FALSE(quantize_affine(w.data(), 1, 64, 4, 48).has_value());
  EXPECT_FALSE(quantize_affine(w.data(), 1, 48, 4, 32).has_value());
  // A constant group quantizes exactly.
  std::fill(w.begin(), w.end(), 0.75f);
  auto q = quantize_affine(w.data(), 1, 64, 4, 32);
  ASSERT_TRUE(q.has_value());
  std::vector<float> r(64);
  q->view().dequantize_row(0, r.data());
  for (float x : r) EXPECT_EQ(x, 0.75f);
}

}  // namespace
}  // namespace pd
