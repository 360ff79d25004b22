// A weight matrix as stored in a checkpoint, whatever the model: a non-owning view of f32/f16/bf16 or MLX
// affine data in the memory-mapped file (or a load-time buffer). The model-specific sets of bound weights
// are model/model_weights.h; the MoE weights a backend binds are backend/backend.h's MoeWeights.
#pragma once

#include <cstdint>
#include <string>

#include "puredrive/util/dtype.h"

namespace pd {

enum class WeightFormat { kF32, kF16, kBF16, kAffine };

const char* weight_format_name(WeightFormat f);

// A 2-D weight W[rows = out, cols = in] used as y = x * W^T. Non-owning view into mapped or owned memory.
struct Matrix {
  WeightFormat format = WeightFormat::kF32;
  int64_t rows = 0;
  int64_t cols = 0;            // logical input width (unpacked)
  const void* data = nullptr;  // dense: rows*cols elements row-major; affine: rows x (cols*bits/32) uint32
  // MLX affine only: w = scale * q + bias per group of group_size consecutive columns.
  int bits = 0;
  int group_size = 0;
  DType scale_dtype = DType::kBF16;  // dtype of scales and biases
  const void* scales = nullptr;      // [rows, cols/group_size]
  const void* biases = nullptr;      // [rows, cols/group_size]
  std::string name;                  // canonical name, for error messages

  bool empty() const { return data == nullptr; }
  // Bytes read by one full pass over the matrix (codes + scales + biases for affine).
  int64_t nbytes() const;
  // Row r dequantised to f32 (reference path and tests; backends use their own kernels).
  void dequantize_row(int64_t r, float* out) const;
  // A view of rows [begin, begin + count).
  Matrix row_slice(int64_t begin, int64_t count) const;
};

}  // namespace pd
