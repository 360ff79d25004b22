// How the CUDA decode attention cuts a row's keys into splits (docs/DESIGN.md §4.1), shared by the host
// (tests, scratch sizing) and the kernels. Row r at position p attends keys [0, p], ceil((p + 1) / 64) tiles
// of kAttnTile keys; they are cut into splits of T(p) whole tiles starting at multiples of T(p) tiles, each
// split's partial softmax is computed by one work item, and the partials are merged in ascending order. T(p)
// is the fewest tiles per split that needs at most attn_max_splits() splits, so it depends on the position
// alone: never on R, the other rows, the cache capacity or timing, and every row of a verify step is bitwise
// the one-row step at its position.
//
// Why from the position and not from the capacity: a cache sized for 256K tokens that holds 2K would get
// 2K-key splits, one work item per KV head, and leave the GPU idle; with T(p) a short context gets one-tile
// splits (many items) and a long one few, long splits (a small merge). Why any whole number of tiles and not
// a power of two: just past a power of two a doubling split size halves the work items (65 splits where 128
// are allowed), and half the GPU then waits on the other half (the 32K and 128K cells read the cache at 1.0
// and 1.5 TB/s that way); with T(p) = ceil(tiles / attn_max_splits) a long context keeps close to the bound.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define PD_ATTN_FN __host__ __device__ __forceinline__
#else
#define PD_ATTN_FN inline
#endif

namespace pd::cuda {

constexpr int kAttnTile = 64;  // keys per tile; splits are whole tiles and start on multiples of 64
// Target work items (splits x KV heads) of one row at long contexts: two per multiprocessor of the 132-SM
// H100 / H200, the decode kernel's resident blocks.
constexpr int kAttnItems = 264;

// The most splits a row may have: bounds the merge and the partial-result scratch.
PD_ATTN_FN int attn_max_splits(int num_kv_heads) {
  const int s = kAttnItems / (num_kv_heads > 0 ? num_kv_heads : 1);
  return s > 1 ? s : 1;
}

// S(p): keys per split for the row at `position` (>= 0), T(p) whole tiles.
PD_ATTN_FN int attn_split_size(int32_t position, int num_kv_heads) {
  const int64_t tiles = (static_cast<int64_t>(position) + kAttnTile) / kAttnTile;
  const int64_t most = attn_max_splits(num_kv_heads);
  return static_cast<int>((tiles + most - 1) / most * kAttnTile);
}

// Splits of the row at `position`: ceil((position + 1) / S(position)).
PD_ATTN_FN int attn_num_splits(int32_t position, int num_kv_heads) {
  const int64_t s = attn_split_size(position, num_kv_heads);
  return static_cast<int>((static_cast<int64_t>(position) + s) / s);
}

}  // namespace pd::cuda
