// The partition arithmetic of the CUDA grouped MoE (backend/cuda/moe_partition.h), which the kernels and the
// host reference share, checked on the CPU against brute force: every entry listed once under its expert in
// ascending row order, the tile starts, the tile-to-expert search, and the worst-case tile bound the launch
// grids use.
#include "puredrive/backend/cuda/moe_partition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

namespace pd::cuda {
namespace {

constexpr int kTile = 64;

// sel [rows, K]: each row's K distinct experts, ascending: random ones, or 0..K-1 when skewed.
std::vector<int> routing(int rows, int k, int experts, std::mt19937& rng, bool skewed) {
  std::vector<int> sel(static_cast<size_t>(rows * k));
  std::vector<int> ids(static_cast<size_t>(experts));
  for (int r = 0; r < rows; ++r) {
    std::iota(ids.begin(), ids.end(), 0);
    if (!skewed) std::shuffle(ids.begin(), ids.end(), rng);
    std::sort(ids.begin(), ids.begin() + k);
    std::copy_n(ids.begin(), k, sel.begin() + r * k);
  }
  return sel;
}

void check_partition(const std::vector<int>& sel, int rows, int k, int experts) {
  const MoePartition p = moe_partition_reference(sel, rows, k, experts, kTile);
  int total = 0;
  for (int e = 0; e < experts; ++e) {
    const int n = p.count[static_cast<size_t>(e)];
    total += n;
    // Brute force: the entries of expert e in ascending row order.
    std::vector<int> want;
    for (int v = 0; v < rows * k; ++v) {
      if (sel[static_cast<size_t>(v)] == e) want.push_back(v);
    }
    ASSERT_EQ(static_cast<int>(want.size()), n) << "expert " << e;
    const auto first = p.list.begin() + static_cast<std::ptrdiff_t>(e) * rows;
    EXPECT_TRUE(std::equal(want.begin(), want.end(), first)) << "entries of expert " << e;
    EXPECT_EQ(p.tile_start[static_cast<size_t>(e) + 1] - p.tile_start[static_cast<size_t>(e)],
              (n + kTile - 1) / kTile)
        << "tiles of expert " << e;
    for (int t = p.tile_start[static_cast<size_t>(e)]; t < p.tile_start[static_cast<size_t>(e) + 1]; ++t) {
      EXPECT_EQ(expert_of_tile(p.tile_start.data(), experts, t), e) << "tile " << t;
    }
  }
  EXPECT_EQ(total, rows * k);
  EXPECT_EQ(p.tile_start[0], 0);
  EXPECT_LE(p.tile_start[static_cast<size_t>(experts)], max_moe_tiles(rows, k, experts, kTile));
}

TEST(MoePartition, RandomRoutings) {
  std::mt19937 rng(7);
  for (int rows : {1, 2, 37, 64, 65, 300, 2048}) {
    for (auto [k, experts] : {std::pair{2, 8}, std::pair{8, 64}, std::pair{8, 256}}) {
      SCOPED_TRACE(testing::Message() << "rows " << rows << " k " << k << " experts " << experts);
      check_partition(routing(rows, k, experts, rng, false), rows, k, experts);
    }
  }
}

// Every row picks experts 0..K-1: one expert gets every row, most get none (empty tile ranges the search
// must skip).
TEST(MoePartition, SkewedRouting) {
  std::mt19937 rng(8);
  for (int rows : {1, 64, 130}) {
    const std::vector<int> sel = routing(rows, 8, 256, rng, true);
    check_partition(sel, rows, 8, 256);
    const MoePartition p = moe_partition_reference(sel, rows, 8, 256, kTile);
    EXPECT_EQ(p.count[0], rows);
    EXPECT_EQ(p.count[200], 0);
  }
}

// The grid bound holds for the routing that maximises the tiles: every entry opens a partial tile in its
// own expert as long as experts remain.
TEST(MoePartition, TileBoundIsReachedAndNotExceeded) {
  for (int rows : {1, 3, 33, 100}) {
    const int k = 8, experts = 256;
    std::vector<int> sel(static_cast<size_t>(rows * k));
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < k; ++i) sel[static_cast<size_t>(r * k + i)] = (r * k + i) % experts;
      std::sort(sel.begin() + r * k, sel.begin() + (r + 1) * k);
    }
    check_partition(sel, rows, k, experts);
    const MoePartition p = moe_partition_reference(sel, rows, k, experts, kTile);
    if (rows * k <= experts) {
      EXPECT_EQ(p.tile_start[static_cast<size_t>(experts)], rows * k) << "one tile per entry";
    }
  }
  EXPECT_EQ(tiles_for_rows(0, kTile), 0);
  EXPECT_EQ(tiles_for_rows(64, kTile), 1);
  EXPECT_EQ(tiles_for_rows(65, kTile), 2);
}

}  // namespace
}  // namespace pd::cuda
