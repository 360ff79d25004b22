#include "puredrive/model/qkvz_reorder.h"

#include <cstring>

#include "puredrive/checkpoint/affine.h"

namespace pd {

QkvzOrder qwen3_next_qkvz_order(int key_heads, int value_heads, int key_dim, int value_dim) {
  const int64_t r = value_heads / key_heads;
  const int64_t group =
      2 * key_dim + 2 * r * value_dim;  // rows per key-head group: q, k, v (r heads), z (r heads)
  QkvzOrder o;
  std::vector<int64_t> k_rows;
  for (int64_t g = 0; g < key_heads; ++g) {
    const int64_t base = g * group;
    for (int64_t i = 0; i < key_dim; ++i) o.qkv.push_back(base + i);
    for (int64_t i = 0; i < key_dim; ++i) k_rows.push_back(base + key_dim + i);
    for (int64_t i = 0; i < r * value_dim; ++i) o.z.push_back(base + 2 * key_dim + r * value_dim + i);
    for (int64_t i = 0; i < r; ++i) o.b.push_back(g * 2 * r + i);
    for (int64_t i = 0; i < r; ++i) o.a.push_back(g * 2 * r + r + i);
  }
  o.qkv.insert(o.qkv.end(), k_rows.begin(), k_rows.end());
  for (int64_t g = 0; g < key_heads; ++g) {
    for (int64_t i = 0; i < r * value_dim; ++i) o.qkv.push_back(g * group + 2 * key_dim + i);
  }
  return o;
}

Matrix gather_rows(const Matrix& src, const std::vector<int64_t>& rows, const std::string& name,
                   std::vector<std::shared_ptr<const void>>* storage) {
  Matrix m = src;
  m.name = name;
  m.rows = static_cast<int64_t>(rows.size());
  const int64_t n = m.rows;
  auto aligned = [](size_t x) { return (x + 63) & ~static_cast<size_t>(63); };
  if (src.format != WeightFormat::kAffine) {
    const size_t row_bytes = static_cast<size_t>(src.cols) * (src.format == WeightFormat::kF32 ? 4 : 2);
    auto buf = std::make_shared<std::vector<uint8_t>>(row_bytes * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(buf->data() + i * row_bytes, src.row_slice(rows[i], 1).data, row_bytes);
    }
    m.data = buf->data();
    storage->push_back(buf);
    return m;
  }
  const size_t code_bytes = static_cast<size_t>(affine_packed_cols(src.cols, src.bits)) * 4;
  const size_t group_bytes = static_cast<size_t>(src.cols / src.group_size) * dtype_size(src.scale_dtype);
  const size_t codes_size = aligned(code_bytes * static_cast<size_t>(n));
  const size_t groups_size = aligned(group_bytes * static_cast<size_t>(n));
  auto buf = std::make_shared<std::vector<uint8_t>>(codes_size + 2 * groups_size);
  uint8_t* codes = buf->data();
  uint8_t* scales = codes + codes_size;
  uint8_t* biases = scales + groups_size;
  for (int64_t i = 0; i < n; ++i) {
    const Matrix row = src.row_slice(rows[i], 1);
    std::memcpy(codes + i * code_bytes, row.data, code_bytes);
    std::memcpy(scales + i * group_bytes, row.scales, group_bytes);
    std::memcpy(biases + i * group_bytes, row.biases, group_bytes);
  }
  m.data = codes;
  m.scales = scales;
  m.biases = biases;
  storage->push_back(buf);
  return m;
}

}  // namespace pd
