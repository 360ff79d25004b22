// Argument checks shared by the backends: every failure names the op, the argument, what was expected and
// what was found. A backend adds only what its kernels need beyond these (alignment, column multiples).
#pragma once

#include <cstdint>

#include "puredrive/backend/backend.h"

namespace pd {

inline const char* device_name(Device d) {
  return d == Device::kCuda ? "CUDA" : "CPU";
}

// dtype, shape (-1: any) and a row stride of at least the width, in the memory of `device`.
inline Status check_tensor_on(Device device, const char* op, const char* arg, const Tensor& t, DType dtype,
                              int64_t rows, int64_t cols) {
  if (t.empty()) return make_error(ErrorCode::kInvalidArgument, "{}: {} is empty", op, arg);
  if (t.device != device) {
    return make_error(ErrorCode::kInvalidArgument, "{}: {} is not {} memory", op, arg, device_name(device));
  }
  if (t.dtype != dtype) {
    return make_error(ErrorCode::kInvalidArgument, "{}: {} has dtype {}, expected {}", op, arg,
                      dtype_name(t.dtype), dtype_name(dtype));
  }
  if ((rows >= 0 && t.rows != rows) || (cols >= 0 && t.cols != cols)) {
    return make_error(ErrorCode::kInvalidArgument, "{}: {} is [{}, {}], expected [{}, {}]", op, arg, t.rows,
                      t.cols, rows, cols);
  }
  if (t.stride < t.cols) {
    return make_error(ErrorCode::kInvalidArgument, "{}: {} has row stride {} < cols {}", op, arg, t.stride,
                      t.cols);
  }
  return Status::ok();
}

// A KV cache: F32 or BF16, contiguous rows of `cols` entries.
inline Status check_kv_layout(const char* op, const char* arg, const Tensor& t, int64_t cols) {
  if (t.empty()) return make_error(ErrorCode::kInvalidArgument, "{}: {} is empty", op, arg);
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16) {
    return make_error(ErrorCode::kInvalidArgument, "{}: {} has dtype {}, expected F32 or BF16", op, arg,
                      dtype_name(t.dtype));
  }
  if (t.cols != cols || !t.contiguous()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: {} is [{}, {}] (stride {}), expected contiguous [T, {}]", op, arg, t.rows, t.cols,
                      t.stride, cols);
  }
  return Status::ok();
}

inline Status check_matrix_shape(const char* op, const Matrix& m, int64_t rows, int64_t cols) {
  if ((rows >= 0 && m.rows != rows) || (cols >= 0 && m.cols != cols)) {
    return make_error(ErrorCode::kInvalidArgument, "{}: weight {} is [{}, {}], expected [{}, {}]", op, m.name,
                      m.rows, m.cols, rows, cols);
  }
  return Status::ok();
}

// A weight every backend can bind: not empty; affine with 2..8 bits, groups of a multiple of 32 dividing the
// columns, scales and biases in bf16/f16/f32.
inline Status validate_matrix(const Matrix& m) {
  if (m.empty() || m.rows <= 0 || m.cols <= 0) {
    return make_error(ErrorCode::kInvalidArgument, "bind_matrix: {} is empty ([{}, {}])", m.name, m.rows,
                      m.cols);
  }
  if (m.format != WeightFormat::kAffine) return Status::ok();
  if (m.bits < 2 || m.bits > 8) {
    return make_error(ErrorCode::kUnsupported, "bind_matrix: {} has {} bits, supported 2..8", m.name, m.bits);
  }
  if (m.group_size <= 0 || m.group_size % 32 != 0 || m.cols % m.group_size != 0) {
    return make_error(
        ErrorCode::kUnsupported,
        "bind_matrix: {} has group size {} for {} columns; need a multiple of 32 dividing the columns",
        m.name, m.group_size, m.cols);
  }
  if (m.scales == nullptr || m.biases == nullptr) {
    return make_error(ErrorCode::kInvalidArgument, "bind_matrix: {} is affine but has no scales/biases",
                      m.name);
  }
  if (m.scale_dtype != DType::kBF16 && m.scale_dtype != DType::kF16 && m.scale_dtype != DType::kF32) {
    return make_error(ErrorCode::kUnsupported, "bind_matrix: {} has scales of dtype {}", m.name,
                      dtype_name(m.scale_dtype));
  }
  return Status::ok();
}

}  // namespace pd
