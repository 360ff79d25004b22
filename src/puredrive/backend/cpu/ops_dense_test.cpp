// matmul, embed, rms_norm, add, argmax against naive double-precision references; row-exactness and
// thread-count independence of matmul.
#include <gtest/gtest.h>

#include <limits>

#include "puredrive/backend/cpu/test_util.h"

namespace pd {
namespace {

using test::device_tensor;
using test::to_host;

std::vector<double> naive_matmul(const std::vector<float>& x, int64_t rows, const test::OwnedMatrix& w) {
  std::vector<double> out(static_cast<size_t>(rows * w.m.rows));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t n = 0; n < w.m.rows; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < w.m.cols; ++k) {
        acc += static_cast<double>(x[static_cast<size_t>(r * w.m.cols + k)]) *
               w.reference[static_cast<size_t>(n * w.m.cols + k)];
      }
      out[static_cast<size_t>(r * w.m.rows + n)] = acc;
    }
  }
  return out;
}

TEST(CpuOps, MatmulEveryFormat) {
  std::mt19937 rng(10);
  auto be = test::cpu_backend(2);
  struct Case {
    WeightFormat f;
    int bits, gs;
  };
  std::vector<Case> cases = {
      {WeightFormat::kF32, 0, 0}, {WeightFormat::kF16, 0, 0}, {WeightFormat::kBF16, 0, 0}};
  for (int bits = 2; bits <= 8; ++bits) cases.push_back({WeightFormat::kAffine, bits, bits % 2 ? 32 : 64});
  cases.push_back({WeightFormat::kAffine, 4, 128});
  for (const Case& c : cases) {
    const int64_t rows = 3, n = 37, k = 256;
    auto w = test::make_matrix(rng, n, k, c.f, c.bits, c.gs);
    Expected<MatrixId> id = be->bind_matrix(w->m);
    ASSERT_TRUE(id.has_value()) << id.status().to_string();
    const auto x = test::random_vector(rng, static_cast<size_t>(rows * k));
    Buffer xt = device_tensor(*be, DType::kF32, rows, k, x);
    Buffer out = device_tensor<float>(*be, DType::kF32, rows, n, {});
    ASSERT_TRUE(be->matmul({.w = *id, .x = xt.tensor(), .out = out.tensor()}).is_ok());
    const auto ref = naive_matmul(x, rows, *w);
    EXPECT_LT(test::rel_err(to_host(*be, out.tensor()), ref), 1e-5)
        << weight_format_name(c.f) << " bits " << c.bits << " group " << c.gs;

    // Accum::kAdd adds the product to what is there.
    ASSERT_TRUE(be->matmul({.w = *id, .x = xt.tensor(), .out = out.tensor(), .accum = Accum::kAdd}).is_ok());
    std::vector<double> twice(ref.size());
    for (size_t i = 0; i < ref.size(); ++i) twice[i] = 2 * ref[i];
    EXPECT_LT(test::rel_err(to_host(*be, out.tensor()), twice), 1e-5);
  }
}

TEST(CpuOps, MatmulRowExactAndThreadIndependent) {
  std::mt19937 rng(11);
  const int64_t n = 53;
  // 8 rows: one weight row per work item; 40: blocks of weight rows (53 = 3 x 16 + 5), and with 8192
  // columns the inputs in slices of 8 rows.
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{8, 256}, {40, 256}, {40, 8192}}) {
    for (WeightFormat f : {WeightFormat::kAffine, WeightFormat::kBF16, WeightFormat::kF16}) {
      auto w = test::make_matrix(rng, n, cols, f, 5, 64);
      const auto x = test::random_vector(rng, static_cast<size_t>(rows * cols));
      std::vector<float> first;
      for (int threads : {1, 2, 4}) {
        auto be = test::cpu_backend(threads);
        const MatrixId id = be->bind_matrix(w->m).value();
        Buffer xt = device_tensor(*be, DType::kF32, rows, cols, x);
        Buffer all = device_tensor<float>(*be, DType::kF32, rows, n, {});
        ASSERT_TRUE(be->matmul({.w = id, .x = xt.tensor(), .out = all.tensor()}).is_ok());
        const auto full = to_host(*be, all.tensor());
        if (first.empty()) first = full;
        EXPECT_TRUE(test::bitwise_equal(full, first)) << threads << " threads";
        for (int64_t r = 0; r < rows; ++r) {
          Buffer one = device_tensor<float>(*be, DType::kF32, 1, n, {});
          ASSERT_TRUE(be->matmul({.w = id, .x = xt.row_slice(r, 1), .out = one.tensor()}).is_ok());
          const auto row = to_host(*be, one.tensor());
          EXPECT_EQ(std::memcmp(row.data(), full.data() + r * n, static_cast<size_t>(n) * 4), 0)
              << weight_format_name(f) << " " << rows << " x " << cols << ", row " << r;
        }
      }
    }
  }
}

TEST(CpuOps, EmbedRmsNormAdd) {
  std::mt19937 rng(12);
  auto be = test::cpu_backend(2);
  const int64_t vocab = 20, h = 64;
  auto table = test::make_matrix(rng, vocab, h, WeightFormat::kAffine, 4, 32);
  const MatrixId tid = be->bind_matrix(table->m).value();
  const std::vector<int32_t> ids = {3, 0, 19, 3};
  Buffer tok = device_tensor(*be, DType::kI32, 4, 1, ids);
  Buffer e = device_tensor<float>(*be, DType::kF32, 4, h, {});
  ASSERT_TRUE(be->embed({.table = tid, .tokens = tok.tensor(), .out = e.tensor()}).is_ok());
  const auto emb = to_host(*be, e.tensor());
  for (size_t r = 0; r < ids.size(); ++r) {
    EXPECT_EQ(std::memcmp(emb.data() + r * h, table->reference.data() + ids[r] * h, h * 4), 0);
  }
  const std::vector<int32_t> bad = {20};
  Buffer badt = device_tensor(*be, DType::kI32, 1, 1, bad);
  EXPECT_FALSE(be->embed({.table = tid, .tokens = badt.tensor(), .out = e.row_slice(0, 1)}).is_ok());

  const auto w = test::random_vector(rng, h);
  const VectorId wid = be->bind_vector(w, "norm").value();
  Buffer y = device_tensor<float>(*be, DType::kF32, 4, h, {});
  ASSERT_TRUE(be->rms_norm({.x = e.tensor(), .weight = wid, .eps = 1e-6f, .out = y.tensor()}).is_ok());
  const auto yh = to_host(*be, y.tensor());
  std::vector<double> ref(yh.size());
  for (int64_t r = 0; r < 4; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < h; ++i) ss += double{emb[r * h + i]} * emb[r * h + i];
    const double inv = 1.0 / std::sqrt(ss / h + 1e-6);
    for (int64_t i = 0; i < h; ++i) ref[r * h + i] = emb[r * h + i] * inv * w[i];
  }
  EXPECT_LT(test::rel_err(yh, ref), 1e-6);

  ASSERT_TRUE(be->add({.a = y.tensor(), .b = e.tensor(), .out = y.tensor()}).is_ok());
  const auto sum = to_host(*be, y.tensor());
  for (size_t i = 0; i < sum.size(); ++i) EXPECT_EQ(sum[i], yh[i] + emb[i]);
}

// matmuls with an input norm: the products of rms_norm(x), bitwise as rms_norm() then matmuls; x unchanged.
TEST(CpuOps, MatmulsInputNormEqualsRmsNormThenMatmuls) {
  std::mt19937 rng(14);
  auto be = test::cpu_backend(2);
  const int64_t rows = 3, k = 96;
  auto w1 = test::make_matrix(rng, 40, k, WeightFormat::kBF16);
  auto w2 = test::make_matrix(rng, 8, k, WeightFormat::kAffine, 8, 32);
  const MatrixId i1 = be->bind_matrix(w1->m).value(), i2 = be->bind_matrix(w2->m).value();
  const VectorId nw = be->bind_vector(test::random_vector(rng, k), "norm").value();
  const auto x = test::random_vector(rng, static_cast<size_t>(rows * k));
  Buffer xt = device_tensor(*be, DType::kF32, rows, k, x);
  Buffer u = device_tensor<float>(*be, DType::kF32, rows, k, {});
  Buffer a1 = device_tensor<float>(*be, DType::kF32, rows, 40, {}),
         a2 = device_tensor<float>(*be, DType::kF32, rows, 8, {});
  Buffer b1 = device_tensor<float>(*be, DType::kF32, rows, 40, {}),
         b2 = device_tensor<float>(*be, DType::kF32, rows, 8, {});
  const std::vector<MatmulTarget> fused = {{i1, a1.tensor()}, {i2, a2.tensor()}};
  const std::vector<MatmulTarget> plain = {{i1, b1.tensor()}, {i2, b2.tensor()}};
  ASSERT_TRUE(
      be->matmuls(
            {.x = xt.tensor(), .targets = fused, .norm = {.weight = nw, .eps = 1e-5f, .scratch = u.tensor()}})
          .is_ok());
  EXPECT_TRUE(test::bitwise_equal(to_host(*be, xt.tensor()), x));
  ASSERT_TRUE(be->rms_norm({.x = xt.tensor(), .weight = nw, .eps = 1e-5f, .out = u.tensor()}).is_ok());
  ASSERT_TRUE(be->matmuls({.x = u.tensor(), .targets = plain}).is_ok());
  EXPECT_TRUE(test::bitwise_equal(to_host(*be, a1.tensor()), to_host(*be, b1.tensor())));
  EXPECT_TRUE(test::bitwise_equal(to_host(*be, a2.tensor()), to_host(*be, b2.tensor())));
  const Status alias =
      be->matmuls({.x = xt.tensor(), .targets = fused, .norm = {.weight = nw, .scratch = xt.tensor()}});
  EXPECT_NE(alias.message().find("norm.scratch aliases"), std::string::npos) << alias.message();
}

TEST(CpuOps, ArgmaxTiesToLowestAndSkipsNan) {
  auto be = test::cpu_backend(1);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x = {1, 5, 5, 2, nan, 3, 3, 0, -1, -1, -1, -1, nan, nan, 7, 7};
  Buffer xt = device_tensor(*be, DType::kF32, 4, 4, x);
  Buffer out = device_tensor<int32_t>(*be, DType::kI32, 4, 1, {});
  ASSERT_TRUE(be->argmax({.x = xt.tensor(), .out = out.tensor()}).is_ok());
  std::vector<int32_t> ids(4);
  ASSERT_TRUE(be->download(ids.data(), out.tensor()).is_ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 1, 0, 2}));
}

TEST(CpuOps, BadShapesAreErrors) {
  std::mt19937 rng(13);
  auto be = test::cpu_backend(1);
  auto w = test::make_matrix(rng, 4, 32, WeightFormat::kF32);
  const MatrixId id = be->bind_matrix(w->m).value();
  Buffer x = device_tensor<float>(*be, DType::kF32, 2, 31, {});
  Buffer out = device_tensor<float>(*be, DType::kF32, 2, 4, {});
  const Status s = be->matmul({.w = id, .x = x.tensor(), .out = out.tensor()});
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("[2, 31]"), std::string::npos) << s.message();
  EXPECT_FALSE(be->matmul({.w = MatrixId{7}, .x = x.tensor(), .out = out.tensor()}).is_ok());
  Matrix odd = w->m;
  odd.format = WeightFormat::kAffine;
  odd.bits = 4;
  odd.group_size = 24;
  EXPECT_FALSE(be->bind_matrix(odd).has_value());
  odd.cols = 96;
  odd.group_size = 96;  // a multiple of 32 dividing the columns, but not a group size MLX writes
  const auto bad_group = be->bind_matrix(odd);
  ASSERT_FALSE(bad_group.has_value());
  EXPECT_NE(bad_group.status().message().find("need 32, 64 or 128"), std::string::npos)
      << bad_group.status().message();
}

}  // namespace
}  // namespace pd
