// The split plan of the CUDA decode attention (cuda/attention_plan.h), checked on the host: it is plain
// arithmetic shared by the kernels, and row-exactness rests on it depending on the position alone.
#include "puredrive/backend/cuda/attention_plan.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace pd::cuda {
namespace {

TEST(AttentionPlan, SplitsAreWholeTilesCoverTheKeysAndStayBelowTheBound) {
  for (int hkv : {1, 2, 4, 16, 64}) {
    const int most = attn_max_splits(hkv);
    int previous = kAttnTile;
    for (int32_t pos = 0; pos < 600000; pos += pos < 20000 ? 1 : 97) {
      const int s = attn_split_size(pos, hkv), n = attn_num_splits(pos, hkv);
      ASSERT_EQ(s % kAttnTile, 0) << pos;
      ASSERT_LE(n, most) << "hkv " << hkv << " position " << pos;
      // Splits [c s, (c + 1) s) for c < n cover keys [0, pos] and the last one is not empty.
      ASSERT_GE(int64_t{n} * s, int64_t{pos} + 1);
      ASSERT_LE(int64_t{n - 1} * s, pos);
      // The smallest such size: one tile less would need too many splits.
      if (s > kAttnTile) {
        const int64_t smaller = s - kAttnTile;
        ASSERT_GT((int64_t{pos} + smaller) / smaller, most) << pos;
      }
      ASSERT_GE(s, previous) << "never shrinks as the context grows";
      previous = s;
    }
  }
}

TEST(AttentionPlan, SizesOfTheThirtyFiveBShape) {
  // Two KV heads: at most 132 splits, so one-tile splits up to 8448 keys, then T tiles per split.
  EXPECT_EQ(attn_max_splits(2), 132);
  EXPECT_EQ(attn_split_size(0, 2), 64);
  EXPECT_EQ(attn_num_splits(0, 2), 1);
  EXPECT_EQ(attn_split_size(2047, 2), 64);
  EXPECT_EQ(attn_num_splits(2047, 2), 32);
  EXPECT_EQ(attn_split_size(8447, 2), 64);
  EXPECT_EQ(attn_num_splits(8447, 2), 132);
  EXPECT_EQ(attn_split_size(8448, 2), 128);
  EXPECT_EQ(attn_num_splits(8448, 2), 67);
  // Just past 32K and 128K keys (the bench's long cells) the splits stay near the bound, not at half of it.
  EXPECT_EQ(attn_split_size(32768, 2), 256);
  EXPECT_EQ(attn_num_splits(32768, 2), 129);
  EXPECT_EQ(attn_split_size(131072, 2), 1024);
  EXPECT_EQ(attn_num_splits(131072, 2), 129);
  EXPECT_EQ(attn_split_size(262143, 2), 2048);
  EXPECT_EQ(attn_num_splits(262143, 2), 128);
}

TEST(AttentionPlan, ExtremeInputs) {
  EXPECT_EQ(attn_max_splits(1), kAttnItems);
  EXPECT_EQ(attn_max_splits(kAttnItems * 2), 1);
  EXPECT_EQ(attn_max_splits(0), kAttnItems);  // guarded, never a division by zero
  const int32_t last = std::numeric_limits<int32_t>::max() - 1;
  EXPECT_LE(attn_num_splits(last, 2), 132);
  EXPECT_GE(int64_t{attn_num_splits(last, 2)} * attn_split_size(last, 2), int64_t{last} + 1);
}

}  // namespace
}  // namespace pd::cuda
