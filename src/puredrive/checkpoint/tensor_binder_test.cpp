// TensorBinder on a small hand-written safetensors file: names spelled with a stored prefix, float and MLX
// affine matrices, shape errors naming the stored tensor and both shapes, config.json quantization checks,
// f32 reads and the listing.
#include "puredrive/checkpoint/tensor_binder.h"

#include <gtest/gtest.h>

#include "puredrive/checkpoint/affine.h"
#include "puredrive/checkpoint/safetensors_writer.h"
#include "puredrive/checkpoint/temp_dir_test_util.h"

namespace pd {
namespace {

using testing_util::TempDir;

std::vector<uint8_t> bytes_of(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  return std::vector<uint8_t>(b, b + n);
}

class TensorBinderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SafetensorsWriter w;
    // Stored with mlx-vlm's prefix: canonical "model.dense.weight".
    ASSERT_TRUE(w.add_f32("model.language_model.dense.weight", DType::kBF16, {2, 4}, {1, 2, 3, 4, 5, 6, 7, 8})
                    .is_ok());
    ASSERT_TRUE(w.add_f32("model.language_model.norm.weight", DType::kF32, {4}, {0.5f, -1, 0, 2}).is_ok());
    ASSERT_TRUE(w.add_f32("model.language_model.extra.weight", DType::kF32, {1}, {1}).is_ok());
    ASSERT_TRUE(w.add_f32("model.visual.patch.weight", DType::kF32, {1}, {1}).is_ok());
    // A 4-bit, group-32 matrix [2, 64].
    std::vector<float> wq(2 * 64);
    for (size_t i = 0; i < wq.size(); ++i) wq[i] = static_cast<float>(i % 16) - 7.0f;
    Expected<AffineMatrix> q = quantize_affine(wq.data(), 2, 64, 4, 32);
    ASSERT_TRUE(q.has_value());
    ASSERT_TRUE(w.add("model.language_model.q.weight", DType::kU32, {2, 8},
                      bytes_of(q->codes.data(), q->codes.size() * 4))
                    .is_ok());
    ASSERT_TRUE(w.add("model.language_model.q.scales", DType::kBF16, {2, 2}, q->scales).is_ok());
    ASSERT_TRUE(w.add("model.language_model.q.biases", DType::kBF16, {2, 2}, q->biases).is_ok());
    ASSERT_TRUE(w.write(dir_.file("model.safetensors")).is_ok());
    Expected<TensorStore> s = TensorStore::open_dir(dir_.path());
    ASSERT_TRUE(s.has_value()) << s.status().message();
    store_ = std::make_unique<TensorStore>(std::move(*s));
  }

  TensorBinder binder(const QuantizationConfig* q = nullptr) {
    return TensorBinder(*store_, "ckpt", q, &storage_);
  }

  TempDir dir_;
  std::unique_ptr<TensorStore> store_;
  std::vector<std::shared_ptr<const void>> storage_;
};

TEST_F(TensorBinderTest, BindsFloatAndAffineMatricesUnderCanonicalNames) {
  TensorBinder b = binder();
  ASSERT_TRUE(b.index().is_ok());
  EXPECT_EQ(b.vision_count(), 1u);
  EXPECT_TRUE(b.has("model.dense.weight"));
  EXPECT_EQ(b.display("model.dense.weight"), "model.language_model.dense.weight");

  Expected<Matrix> dense = b.matrix("model.dense", {}, 2, 4);
  ASSERT_TRUE(dense.has_value()) << dense.status().message();
  EXPECT_EQ(dense->format, WeightFormat::kBF16);
  EXPECT_EQ(dense->rows, 2);
  EXPECT_EQ(dense->cols, 4);
  std::vector<float> row(4);
  dense->dequantize_row(1, row.data());
  EXPECT_EQ(row, (std::vector<float>{5, 6, 7, 8}));

  Expected<Matrix> q = b.matrix("model.q", {}, 2, 64);
  ASSERT_TRUE(q.has_value()) << q.status().message();
  EXPECT_EQ(q->format, WeightFormat::kAffine);
  EXPECT_EQ(q->bits, 4);
  EXPECT_EQ(q->group_size, 32);
  std::vector<float> qrow(64);
  q->dequantize_row(0, qrow.data());
  EXPECT_FLOAT_EQ(qrow[3], -4.0f);  // exact: the row's values are integers in [-7, 8] and fit 4 bits

  // Leading dims fold into rows: [1, 2, 4] as [2, 4] is a shape mismatch, not a silent reshape.
  Expected<Matrix> stacked = b.matrix("model.dense", {1}, 2, 4);
  ASSERT_FALSE(stacked.has_value());
  EXPECT_EQ(stacked.status().message(),
            "ckpt: tensor 'model.language_model.dense.weight': expected shape [1, 2, 4], file has [2, 4]");
}

TEST_F(TensorBinderTest, ShapeAndPresenceErrorsNameTheStoredTensorAndBothShapes) {
  TensorBinder b = binder();
  ASSERT_TRUE(b.index().is_ok());
  Expected<Matrix> wrong = b.matrix("model.dense", {}, 4, 2);
  ASSERT_FALSE(wrong.has_value());
  EXPECT_EQ(wrong.status().message(),
            "ckpt: tensor 'model.language_model.dense.weight': expected shape [4, 2], file has [2, 4]");
  Expected<Matrix> missing = b.matrix("model.absent", {}, 3, 4);
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(missing.status().message(),
            "ckpt: missing tensor 'model.language_model.absent.weight' (expected shape [3, 4])");
  Expected<Matrix> q = b.matrix("model.q", {}, 3, 64);
  ASSERT_FALSE(q.has_value());
  EXPECT_NE(q.status().message().find("'model.language_model.q.weight' (quantized: last dim = packed words): "
                                      "expected shape [3, 64], file has [2, 8]"),
            std::string::npos)
      << q.status().message();
}

TEST_F(TensorBinderTest, AffineShapesMustAgreeWithConfigQuantization) {
  QuantizationConfig eight{.global = {.bits = 8, .group_size = 64}, .mode = "affine", .overrides = {}};
  TensorBinder b8 = binder(&eight);
  ASSERT_TRUE(b8.index().is_ok());
  Expected<Matrix> q = b8.matrix("model.q", {}, 2, 64);
  ASSERT_FALSE(q.has_value());
  EXPECT_EQ(q.status().message(),
            "ckpt: 'model.language_model.q': config.json says 8-bit group 64, the tensor shapes say 4-bit "
            "group 32");

  // A per-module override (keyed by the stored path) wins over the global setting.
  QuantizationConfig overridden = eight;
  overridden.overrides["model.language_model.q"] = {.bits = 4, .group_size = 32};
  TensorBinder bo = binder(&overridden);
  ASSERT_TRUE(bo.index().is_ok());
  EXPECT_TRUE(bo.matrix("model.q", {}, 2, 64).has_value());
}

TEST_F(TensorBinderTest, FloatsAndListing) {
  TensorBinder b = binder();
  ASSERT_TRUE(b.index().is_ok());
  Expected<std::vector<float>> norm = b.floats("model.norm.weight", true, "norm, 1+w folded -> f32");
  ASSERT_TRUE(norm.has_value());
  EXPECT_EQ(*norm, (std::vector<float>{1.5f, 0.0f, 1.0f, 3.0f}));
  Expected<std::vector<float>> codes = b.floats("model.q.weight", false, "x");
  ASSERT_FALSE(codes.has_value());
  EXPECT_EQ(codes.status().message(),
            "ckpt: 'model.language_model.q.weight' has dtype U32, expected F32, BF16 or F16");
  ASSERT_TRUE(b.matrix("model.dense", {}, 2, 4).has_value());
  b.append_format("model.dense.weight", ", re-ordered");

  std::vector<std::string> unused;
  const std::vector<TensorListing> l = b.listing(
      [](const std::string& cname) -> const char* { return cname == "model.q.scales" ? "skipped" : nullptr; },
      &unused);
  ASSERT_EQ(l.size(), 7u);
  auto format_of = [&](const std::string& stored) {
    for (const auto& t : l) {
      if (t.name == stored) return t.format;
    }
    return std::string("<absent>");
  };
  EXPECT_EQ(format_of("model.language_model.dense.weight"), "bf16, re-ordered");
  EXPECT_EQ(format_of("model.language_model.norm.weight"), "norm, 1+w folded -> f32");
  EXPECT_EQ(format_of("model.language_model.q.scales"), "skipped");
  EXPECT_EQ(format_of("model.visual.patch.weight"), "ignored (vision tower)");
  EXPECT_EQ(unused,
            (std::vector<std::string>{"model.language_model.extra.weight", "model.language_model.q.biases",
                                      "model.language_model.q.weight"}));
}

}  // namespace
}  // namespace pd
