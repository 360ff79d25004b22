#include "puredrive/checkpoint/affine.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace pd {

void pack_affine_row(const uint32_t* codes, int64_t n, int bits, uint32_t* out) {
  const int64_t words = affine_packed_cols(n, bits);
  std::fill(out, out + words, 0u);
  for (int64_t j = 0; j < n; ++j) {
    const uint64_t bit = static_cast<uint64_t>(j) * static_cast<uint64_t>(bits);
    const uint64_t word = bit >> 5;
    const unsigned shift = static_cast<unsigned>(bit & 31u);
    const uint64_t v = static_cast<uint64_t>(codes[j]) << shift;
    out[word] |= static_cast<uint32_t>(v);
    if (shift + static_cast<unsigned>(bits) > 32u) out[word + 1] |= static_cast<uint32_t>(v >> 32);
  }
}

float load_scale(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, static_cast<const uint8_t*>(p) + 4 * i, 4);
      return f;
    }
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default:
      PD_ASSERT(false, "scale dtype {}", dtype_name(t));
  }
  return 0.0f;
}

namespace {

float round_to(float v, DType t) {
  switch (t) {
    case DType::kBF16:
      return round_to_bf16(v);
    case DType::kF16:
      return f16_to_f32(f32_to_f16(v));
    default:
      return v;
  }
}

void store_scale(std::vector<uint8_t>& buf, DType t, int64_t i, float v) {
  if (t == DType::kF32) {
    std::memcpy(buf.data() + 4 * i, &v, 4);
  } else {
    const uint16_t h = t == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
    std::memcpy(buf.data() + 2 * i, &h, 2);
  }
}

}  // namespace

Matrix AffineMatrix::view(const std::string& name) const {
  Matrix m;
  m.format = WeightFormat::kAffine;
  m.rows = rows;
  m.cols = cols;
  m.data = codes.data();
  m.bits = bits;
  m.group_size = group_size;
  m.scale_dtype = scale_dtype;
  m.scales = scales.data();
  m.biases = biases.data();
  m.name = name;
  return m;
}

Expected<AffineMatrix> quantize_affine(const float* w, int64_t rows, int64_t cols, int bits, int group_size,
                                       DType scale_dtype) {
  if (!affine_bits_supported(bits)) {
    return make_error(ErrorCode::kInvalidArgument, "quantize_affine: bits {} not in {{2, 3, 4, 5, 6, 8}}",
                      bits);
  }
  if (group_size != 32 && group_size != 64 && group_size != 128) {
    return make_error(ErrorCode::kInvalidArgument, "quantize_affine: group_size {} not in {{32, 64, 128}}",
                      group_size);
  }
  if (cols % group_size != 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "quantize_affine: {} columns are not a multiple of group_size {}", cols, group_size);
  }
  if (scale_dtype != DType::kF32 && scale_dtype != DType::kBF16 && scale_dtype != DType::kF16) {
    return make_error(ErrorCode::kInvalidArgument, "quantize_affine: scale dtype {} is not F32, BF16 or F16",
                      dtype_name(scale_dtype));
  }
  AffineMatrix q;
  q.rows = rows;
  q.cols = cols;
  q.bits = bits;
  q.group_size = group_size;
  q.scale_dtype = scale_dtype;
  const int64_t groups = cols / group_size;
  const int64_t words = affine_packed_cols(cols, bits);
  q.codes.assign(static_cast<size_t>(rows * words), 0u);
  q.scales.assign(static_cast<size_t>(rows * groups) * dtype_size(scale_dtype), 0);
  q.biases.assign(q.scales.size(), 0);
  const float qmax = static_cast<float>((1 << bits) - 1);
  std::vector<uint32_t> codes(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = w + r * cols;
    for (int64_t g = 0; g < groups; ++g) {
      const float* x = row + g * group_size;
      const auto [lo, hi] = std::minmax_element(x, x + group_size);
      const float bias = round_to(*lo, scale_dtype);
      const float scale = round_to((*hi - *lo) / qmax, scale_dtype);
      store_scale(q.scales, scale_dtype, r * groups + g, scale);
      store_scale(q.biases, scale_dtype, r * groups + g, bias);
      for (int j = 0; j < group_size; ++j) {
        float c = scale > 0.0f ? std::nearbyint((x[j] - bias) / scale) : 0.0f;
        c = std::clamp(c, 0.0f, qmax);
        codes[static_cast<size_t>(g * group_size + j)] = static_cast<uint32_t>(c);
      }
    }
    pack_affine_row(codes.data(), cols, bits, q.codes.data() + r * words);
  }
  return q;
}

}  // namespace pd
