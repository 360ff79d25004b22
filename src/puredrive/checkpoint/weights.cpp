#include "puredrive/checkpoint/weights.h"

#include <cstring>

#include "puredrive/checkpoint/affine.h"

namespace pd {

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::kF32:
      return "f32";
    case WeightFormat::kF16:
      return "f16";
    case WeightFormat::kBF16:
      return "bf16";
    case WeightFormat::kAffine:
      return "affine";
  }
  return "?";
}

namespace {

size_t dense_elem_size(WeightFormat f) {
  return f == WeightFormat::kF32 ? 4 : 2;
}

}  // namespace

int64_t Matrix::nbytes() const {
  if (format != WeightFormat::kAffine) return rows * cols * static_cast<int64_t>(dense_elem_size(format));
  const int64_t groups = cols / group_size;
  return rows * affine_packed_cols(cols, bits) * 4 +
         2 * rows * groups * static_cast<int64_t>(dtype_size(scale_dtype));
}

void Matrix::dequantize_row(int64_t r, float* out) const {
  PD_ASSERT(r >= 0 && r < rows, "{}: row {} of {}", name, r, rows);
  switch (format) {
    case WeightFormat::kF32:
      std::memcpy(out, static_cast<const float*>(data) + r * cols, static_cast<size_t>(cols) * 4);
      return;
    case WeightFormat::kBF16: {
      const uint16_t* p = static_cast<const uint16_t*>(data) + r * cols;
      for (int64_t j = 0; j < cols; ++j) out[j] = bf16_to_f32(p[j]);
      return;
    }
    case WeightFormat::kF16: {
      const uint16_t* p = static_cast<const uint16_t*>(data) + r * cols;
      for (int64_t j = 0; j < cols; ++j) out[j] = f16_to_f32(p[j]);
      return;
    }
    case WeightFormat::kAffine: {
      const uint32_t* codes = static_cast<const uint32_t*>(data) + r * affine_packed_cols(cols, bits);
      const int64_t groups = cols / group_size;
      for (int64_t g = 0; g < groups; ++g) {
        const float s = load_scale(scales, scale_dtype, r * groups + g);
        const float b = load_scale(biases, scale_dtype, r * groups + g);
        for (int64_t j = g * group_size; j < (g + 1) * group_size; ++j) {
          out[j] = s * static_cast<float>(affine_code(codes, bits, j)) + b;
        }
      }
      return;
    }
  }
}

Matrix Matrix::row_slice(int64_t begin, int64_t count) const {
  PD_ASSERT(begin >= 0 && count >= 0 && begin + count <= rows, "{}: rows [{}, {}) of {}", name, begin,
            begin + count, rows);
  Matrix m = *this;
  m.rows = count;
  if (format != WeightFormat::kAffine) {
    m.data = static_cast<const uint8_t*>(data) + begin * cols * static_cast<int64_t>(dense_elem_size(format));
    return m;
  }
  const int64_t groups = cols / group_size;
  const int64_t ssize = static_cast<int64_t>(dtype_size(scale_dtype));
  m.data = static_cast<const uint32_t*>(data) + begin * affine_packed_cols(cols, bits);
  m.scales = static_cast<const uint8_t*>(scales) + begin * groups * ssize;
  m.biases = static_cast<const uint8_t*>(biases) + begin * groups * ssize;
  return m;
}

}  // namespace pd
