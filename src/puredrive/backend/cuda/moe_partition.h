// The partition of a prefill step's (row, slot) pairs by expert for the grouped MoE products
// (moe_grouped.cu), in code both sides compile: the tile arithmetic the kernels use, and the host reference
// the tests compare the device partition with. No CUDA headers, so CPU-only builds test it too.
//
// Entry v = r * K + slot names row r's slot-th selected expert (slots in ascending expert id). Expert e's
// entries are list[e * rows + i] for i < count[e], in ascending row order (a counting sort, stable); its rows
// form ceil(count[e] / tile_rows) row tiles, numbered from tile_start[e]; tile_start[E] is the total. A row
// tile t belongs to the largest e with tile_start[e] <= t (experts without rows own no tile).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#ifdef __CUDACC__
#define PD_HOST_DEVICE __host__ __device__
#else
#define PD_HOST_DEVICE
#endif

namespace pd::cuda {

PD_HOST_DEVICE inline int tiles_for_rows(int rows, int tile_rows) {
  return (rows + tile_rows - 1) / tile_rows;
}

// The expert owning row tile t (0 <= t < tile_start[experts]): binary search over the nondecreasing starts.
PD_HOST_DEVICE inline int expert_of_tile(const int* tile_start, int experts, int t) {
  int lo = 0, hi = experts;  // tile_start[lo] <= t < tile_start[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (tile_start[mid] <= t) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Row tiles a grid must cover for any routing of `rows` rows: sum_e ceil(count_e / tile_rows) is at most
// (rows * K) / tile_rows rounded up plus one partial tile per expert that has rows.
PD_HOST_DEVICE inline int max_moe_tiles(int rows, int top_k, int experts, int tile_rows) {
  const int entries = rows * top_k;
  return tiles_for_rows(entries, tile_rows) + (experts < entries ? experts : entries);
}

struct MoePartition {
  std::vector<int> list;  // [E, rows]; unused entries 0
  std::vector<int> count;
  std::vector<int> tile_start;  // E + 1
};

// Host reference: sel [rows, K] holds each row's experts.
inline MoePartition moe_partition_reference(const std::vector<int>& sel, int rows, int top_k, int experts,
                                            int tile_rows) {
  MoePartition p;
  p.list.assign(static_cast<size_t>(experts) * static_cast<size_t>(rows), 0);
  p.count.assign(static_cast<size_t>(experts), 0);
  for (int r = 0; r < rows; ++r) {
    for (int k = 0; k < top_k; ++k) {
      const int e = sel[static_cast<size_t>(r * top_k + k)];
      int& c = p.count[static_cast<size_t>(e)];
      p.list[static_cast<size_t>(e) * static_cast<size_t>(rows) + static_cast<size_t>(c++)] = r * top_k + k;
    }
  }
  p.tile_start.assign(static_cast<size_t>(experts) + 1, 0);
  for (int e = 0; e < experts; ++e) {
    p.tile_start[static_cast<size_t>(e) + 1] =
        p.tile_start[static_cast<size_t>(e)] + tiles_for_rows(p.count[static_cast<size_t>(e)], tile_rows);
  }
  return p;
}

}  // namespace pd::cuda
