#include "puredrive/model/synthetic_fill.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "puredrive/util/dtype.h"

namespace pd {
namespace {

// Two attention layers around a GDN layer, small widths.
CacheSpec spec() {
  return {.layers = {LayerType::kFullAttention, LayerType::kLinearAttention, LayerType::kFullAttention},
          .kv_width = 16,
          .conv_channels = 24,
          .conv_kernel = 4,
          .recurrent_heads = 2,
          .recurrent_size = 2 * 8 * 8,
          .mtp_layers = 1};
}

std::unique_ptr<Backend> cpu() {
  return create_backend({.name = "cpu", .threads = 1}).value();
}

std::vector<float> as_f32(Backend& be, const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::kF32) {
    EXPECT_TRUE(be.download(out.data(), t).is_ok());
  } else {
    std::vector<uint16_t> b(out.size());
    EXPECT_TRUE(be.download(b.data(), t).is_ok());
    for (size_t i = 0; i < b.size(); ++i) out[i] = bf16_to_f32(b[i]);
  }
  return out;
}

SequenceState make_state(Backend& be, DType kv, int ctx) {
  return SequenceState::create(be, spec(), {.ctx_size = ctx, .kv_dtype = kv, .max_rows = 4}).value();
}

// Every value within the amplitude, not all zero, and spread over both signs.
void expect_random(const std::vector<float>& v, float amplitude, const char* what) {
  int positive = 0, negative = 0;
  for (float x : v) {
    ASSERT_TRUE(std::isfinite(x) && std::fabs(x) <= amplitude) << what << ": " << x;
    positive += x > 0;
    negative += x < 0;
  }
  EXPECT_GT(positive, static_cast<int>(v.size()) / 4) << what;
  EXPECT_GT(negative, static_cast<int>(v.size()) / 4) << what;
}

TEST(SyntheticFill, FillsTheCachedPrefixAndEveryGdnState) {
  std::unique_ptr<Backend> be = cpu();
  for (DType kv : {DType::kBF16, DType::kF32}) {
    SequenceState st = make_state(*be, kv, 40);
    ASSERT_TRUE(fill_synthetic(*be, st, 30, 7, 3).is_ok());
    EXPECT_EQ(st.length(), 30);
    EXPECT_EQ(st.mtp_length(), 0);
    for (int l : {0, 2}) {
      for (const Tensor& t : {st.kv(l).k, st.kv(l).v}) {
        const std::vector<float> v = as_f32(*be, t);
        expect_random(std::vector<float>(v.begin(), v.begin() + 30 * 16), kSyntheticKvAmplitude, "KV prefix");
        for (size_t i = 30 * 16; i < v.size(); ++i) ASSERT_EQ(v[i], 0.0f) << "KV past the length, at " << i;
      }
    }
    expect_random(as_f32(*be, st.gdn(1).conv), kSyntheticConvAmplitude, "conv window");
    expect_random(as_f32(*be, st.gdn(1).recurrent), kSyntheticRecurrentAmplitude, "recurrent state");
    for (float x : as_f32(*be, st.mtp_kv(0).k)) ASSERT_EQ(x, 0.0f) << "the MTP cache stays empty";
    // Layers and K / V draw from different streams.
    EXPECT_NE(as_f32(*be, st.kv(0).k), as_f32(*be, st.kv(2).k));
    EXPECT_NE(as_f32(*be, st.kv(0).k), as_f32(*be, st.kv(0).v));
  }
}

TEST(SyntheticFill, SameSeedSameStateWhateverTheThreads) {
  std::unique_ptr<Backend> be = cpu();
  SequenceState a = make_state(*be, DType::kBF16, 40), b = make_state(*be, DType::kBF16, 40),
                c = make_state(*be, DType::kBF16, 40);
  ASSERT_TRUE(fill_synthetic(*be, a, 33, 5, 1).is_ok());
  ASSERT_TRUE(fill_synthetic(*be, b, 33, 5, 4).is_ok());
  ASSERT_TRUE(fill_synthetic(*be, c, 33, 6, 2).is_ok());
  EXPECT_EQ(as_f32(*be, a.kv(2).v), as_f32(*be, b.kv(2).v));
  EXPECT_EQ(as_f32(*be, a.gdn(1).recurrent), as_f32(*be, b.gdn(1).recurrent));
  EXPECT_NE(as_f32(*be, a.kv(2).v), as_f32(*be, c.kv(2).v));
  // The generator itself: in range, and element i of a stream does not depend on how it was chunked.
  EXPECT_EQ(synthetic_value(5, 12345, 1.0f), synthetic_value(5, 12345, 1.0f));
  EXPECT_NE(synthetic_value(5, 12345, 1.0f), synthetic_value(5, 12346, 1.0f));
}

TEST(SyntheticFill, RefusesAFilledStateOrTooLongAContext) {
  std::unique_ptr<Backend> be = cpu();
  SequenceState st = make_state(*be, DType::kBF16, 16);
  Status s = fill_synthetic(*be, st, 17, 1);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.to_string().find("do not fit a context of 16"), std::string::npos) << s.to_string();
  EXPECT_FALSE(fill_synthetic(*be, st, 0, 1).is_ok());
  ASSERT_TRUE(fill_synthetic(*be, st, 8, 1).is_ok());
  s = fill_synthetic(*be, st, 8, 1);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.to_string().find("already holds 8 tokens"), std::string::npos) << s.to_string();
}

}  // namespace
}  // namespace pd
