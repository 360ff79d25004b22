// MLX affine quantization (docs/spec/qwen3_5_moe.md §9.2): per row, groups of group_size consecutive input
// columns share a scale s and a bias b, w = s * q + b with q in [0, 2^bits). The codes of a row form one
// little-endian bit stream (code j in bits [j*bits, (j+1)*bits)) stored as uint32 words, so 3-, 5- and 6-bit
// codes straddle words. The reader side here is the reference the backends' kernels are tested against.
#pragma once

#include <bit>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "puredrive/checkpoint/weights.h"
#include "puredrive/util/dtype.h"
#include "puredrive/util/status.h"

namespace pd {

static_assert(std::endian::native == std::endian::little, "MLX packed codes are read as little-endian words");

inline bool affine_bits_supported(int bits) {
  return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
}

// uint32 words per packed row of `cols` codes (cols * bits must be a multiple of 32).
inline int64_t affine_packed_cols(int64_t cols, int bits) {
  return cols * bits / 32;
}

// Code j of a packed row.
inline uint32_t affine_code(const uint32_t* row, int bits, int64_t j) {
  const uint64_t bit = static_cast<uint64_t>(j) * static_cast<uint64_t>(bits);
  const uint64_t word = bit >> 5;
  const unsigned shift = static_cast<unsigned>(bit & 31u);
  uint64_t v = row[word] >> shift;
  if (shift + static_cast<unsigned>(bits) > 32u) v |= static_cast<uint64_t>(row[word + 1]) << (32u - shift);
  return static_cast<uint32_t>(v) & ((1u << bits) - 1u);
}

// Packs n codes (each < 2^bits) into affine_packed_cols(n, bits) words.
void pack_affine_row(const uint32_t* codes, int64_t n, int bits, uint32_t* out);

// MLX affine quantization parameters of one module.
struct QuantParams {
  int bits = 0;
  int group_size = 0;
};

// config.json "quantization" block: global defaults plus per-module overrides keyed by MLX module path.
// An override of `false` (kept in float) is recorded with bits == 0.
struct QuantizationConfig {
  QuantParams global;
  std::string mode = "affine";
  std::map<std::string, QuantParams> overrides;
};

// A quantized matrix that owns its buffers (tests, `puredrive quantize`, `synth`).
struct AffineMatrix {
  int64_t rows = 0;
  int64_t cols = 0;
  int bits = 0;
  int group_size = 0;
  DType scale_dtype = DType::kBF16;
  std::vector<uint32_t> codes;  // [rows, cols * bits / 32]
  std::vector<uint8_t> scales;  // [rows, cols / group_size] in scale_dtype
  std::vector<uint8_t> biases;  // [rows, cols / group_size] in scale_dtype
  // A view; valid while this object lives.
  Matrix view(const std::string& name = {}) const;
};

// MLX's documented quantizer, per group: b = min w, s = (max w - min w) / (2^bits - 1) (both rounded to
// scale_dtype, F32, BF16 or F16), q = clamp(round((w - b) / s)). w is [rows, cols] row-major f32;
// cols must be a multiple of group_size (32, 64 or 128). Test checkpoints use it; mx.quantize itself computes
// something else (quantize_affine_mlx below), which matters only when comparing files byte for byte.
Expected<AffineMatrix> quantize_affine(const float* w, int64_t rows, int64_t cols, int bits, int group_size,
                                       DType scale_dtype = DType::kBF16);

// MLX's own quantizer, as mlx.core.quantize computes it on the CPU (mlx/backend/cpu/quantized.cpp,
// fast::Quantize): per group, the bias is the edge of larger magnitude (min or max) and the scale is signed
// so that the edge lands exactly on a code: s = ±max((max - min) / (2^bits - 1), 1e-7), q0 = rint(edge / s),
// and when q0 != 0, s = edge / q0 and b = edge (else b = 0). Codes are rint((w - b) / s) clamped to [0,
// 2^bits - 1], computed with the float32 s and b; s and b are rounded to scale_dtype only when stored.
// `puredrive quantize` uses this one so that its output is byte-identical to mlx_lm.convert's.
void quantize_affine_mlx_row(const float* w, int64_t cols, int bits, int group_size, DType scale_dtype,
                             uint32_t* codes, void* scales, void* biases);
Expected<AffineMatrix> quantize_affine_mlx(const float* w, int64_t rows, int64_t cols, int bits,
                                           int group_size, DType scale_dtype = DType::kBF16);

// Element i of a scales/biases array of dtype t (F32, F16 or BF16).
float load_scale(const void* p, DType t, int64_t i);

}  // namespace pd
