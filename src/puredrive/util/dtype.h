// Element types found in checkpoints and used by the engine, with the scalar conversions every backend
// shares.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace pd {

enum class DType : uint8_t { kF32, kF16, kBF16, kU32, kI32, kU8, kI8, kI64, kF8E4M3, kBool };

// Bytes per element.
size_t dtype_size(DType t);
// The safetensors spelling ("F32", "BF16", ...).
const char* dtype_name(DType t);
std::optional<DType> dtype_from_safetensors(std::string_view name);

inline float bf16_to_f32(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

// Round to nearest even, as PyTorch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float round_to_bf16(float f) {
  return bf16_to_f32(f32_to_bf16(f));
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float f8e4m3_to_f32(uint8_t v);

}  // namespace pd
