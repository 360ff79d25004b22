// Qwen3-Next stores the GDN input projections grouped by key head ("interleaved GQA layout", spec §5.1); the
// engine wants Qwen3.5's contiguous q|k|v, z, b, a. The loader permutes whole rows once at load, which works
// the same for float and MLX-affine rows (codes, scales and biases of a row move together).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "puredrive/checkpoint/weights.h"

namespace pd {

// The Qwen3-Next grouped in_proj_qkvz / in_proj_ba rows, as source row indices of the contiguous outputs
// (spec §5.1): qkv = [q_0..q_{Hk-1} | k_0.. | v_0..v_{Hv-1}], z = [z_0..], b = [b_0..], a = [a_0..].
struct QkvzOrder {
  std::vector<int64_t> qkv, z, b, a;
};
QkvzOrder qwen3_next_qkvz_order(int key_heads, int value_heads, int key_dim, int value_dim);

// A matrix made of the given rows of `src` (dense or affine), in a buffer owned by `storage`.
Matrix gather_rows(const Matrix& src, const std::vector<int64_t>& rows, const std::string& name,
                   std::vector<std::shared_ptr<const void>>* storage);

}  // namespace pd
