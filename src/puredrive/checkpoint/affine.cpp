#include "puredrive/checkpoint/affine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

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

void store_scale_at(void* buf, DType t, int64_t i, float v) {
  auto* p = static_cast<uint8_t*>(buf);
  if (t == DType::kF32) {
    std::memcpy(p + 4 * i, &v, 4);
  } else {
    const uint16_t h = t == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
    std::memcpy(p + 2 * i, &h, 2);
  }
}

void store_scale(std::vector<uint8_t>& buf, DType t, int64_t i, float v) {
  store_scale_at(buf.data(), t, i, v);
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

namespace {

Status check_quantize_params(int64_t cols, int bits, int group_size, DType scale_dtype) {
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
  return Status::ok();
}

AffineMatrix make_affine(int64_t rows, int64_t cols, int bits, int group_size, DType scale_dtype) {
  AffineMatrix q;
  q.rows = rows;
  q.cols = cols;
  q.bits = bits;
  q.group_size = group_size;
  q.scale_dtype = scale_dtype;
  q.codes.assign(static_cast<size_t>(rows * affine_packed_cols(cols, bits)), 0u);
  q.scales.assign(static_cast<size_t>(rows * (cols / group_size)) * dtype_size(scale_dtype), 0);
  q.biases.assign(q.scales.size(), 0);
  return q;
}

}  // namespace

Expected<AffineMatrix> quantize_affine(const float* w, int64_t rows, int64_t cols, int bits, int group_size,
                                       DType scale_dtype) {
  PD_TRY(check_quantize_params(cols, bits, group_size, scale_dtype));
  AffineMatrix q = make_affine(rows, cols, bits, group_size, scale_dtype);
  const int64_t groups = cols / group_size;
  const int64_t words = affine_packed_cols(cols, bits);
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

void quantize_affine_mlx_row(const float* w, int64_t cols, int bits, int group_size, DType scale_dtype,
                             uint32_t* codes, void* scales, void* biases) {
  const float n_bins = static_cast<float>((1 << bits) - 1);
  const float eps = 1e-7f;
  const int64_t groups = cols / group_size;
  const int64_t words = affine_packed_cols(cols, bits);
  std::fill(codes, codes + words, 0u);
  for (int64_t g = 0; g < groups; ++g) {
    const float* x = w + g * group_size;
    float w_min = std::numeric_limits<float>::infinity();
    float w_max = -w_min;
    for (int j = 0; j < group_size; ++j) {
      w_max = std::max(w_max, x[j]);
      w_min = std::min(w_min, x[j]);
    }
    const bool mask = std::fabs(w_min) > std::fabs(w_max);
    float scale = std::max((w_max - w_min) / n_bins, eps);
    scale = mask ? scale : -scale;
    const float edge = mask ? w_min : w_max;
    const float q0 = std::nearbyint(edge / scale);
    float bias = 0.0f;
    if (q0 != 0.0f) {
      scale = edge / q0;
      bias = edge;
    }
    for (int j = 0; j < group_size; ++j) {
      float c = std::nearbyint((x[j] - bias) / scale);
      c = std::min(std::max(c, 0.0f), n_bins);
      const uint64_t bit = static_cast<uint64_t>(g * group_size + j) * static_cast<uint64_t>(bits);
      const uint64_t v = static_cast<uint64_t>(c) << (bit & 31u);
      codes[bit >> 5] |= static_cast<uint32_t>(v);
      if ((bit & 31u) + static_cast<unsigned>(bits) > 32u)
        codes[(bit >> 5) + 1] |= static_cast<uint32_t>(v >> 32);
    }
    store_scale_at(scales, scale_dtype, g, scale);
    store_scale_at(biases, scale_dtype, g, bias);
  }
}

Expected<AffineMatrix> quantize_affine_mlx(const float* w, int64_t rows, int64_t cols, int bits,
                                           int group_size, DType scale_dtype) {
  PD_TRY(check_quantize_params(cols, bits, group_size, scale_dtype));
  AffineMatrix q = make_affine(rows, cols, bits, group_size, scale_dtype);
  const int64_t groups = cols / group_size;
  const size_t sbytes = static_cast<size_t>(groups) * dtype_size(scale_dtype);
  for (int64_t r = 0; r < rows; ++r) {
    quantize_affine_mlx_row(w + r * cols, cols, bits, group_size, scale_dtype,
                            q.codes.data() + r * affine_packed_cols(cols, bits), q.scales.data() + r * sbytes,
                            q.biases.data() + r * sbytes);
  }
  return q;
}

}  // namespace pd
