#include "puredrive/util/dtype.h"

namespace pd {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kU32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kU8:
    case DType::kI8:
    case DType::kF8E4M3:
    case DType::kBool:
      return 1;
    case DType::kI64:
      return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kU32:
      return "U32";
    case DType::kI32:
      return "I32";
    case DType::kU8:
      return "U8";
    case DType::kI8:
      return "I8";
    case DType::kI64:
      return "I64";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kBool:
      return "BOOL";
  }
  return "?";
}

std::optional<DType> dtype_from_safetensors(std::string_view n) {
  if (n == "F32") return DType::kF32;
  if (n == "F16") return DType::kF16;
  if (n == "BF16") return DType::kBF16;
  if (n == "U32") return DType::kU32;
  if (n == "I32") return DType::kI32;
  if (n == "U8") return DType::kU8;
  if (n == "I8") return DType::kI8;
  if (n == "I64") return DType::kI64;
  if (n == "F8_E4M3") return DType::kF8E4M3;
  if (n == "BOOL") return DType::kBool;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    if (mant == 0) {
      out = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      out = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    out = sign | 0x7f800000u | (mant << 13);
  } else {
    out = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(out);
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (absu >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absu < 0x38800000u) {  // subnormal or zero in f16: round x * 2^24 to an integer, ties to even
    const float scaled = std::bit_cast<float>(absu) * 16777216.0f;
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(scaled)));
  }
  uint32_t mant = absu & 0x7fffffu;
  uint32_t exp = (absu >> 23) - 127 + 15;
  uint32_t half = (exp << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

float f8e4m3_to_f32(uint8_t v) {
  const bool neg = v & 0x80;
  const int exp = (v >> 3) & 0xf;
  const int mant = v & 0x7;
  float out;
  if (exp == 0xf && mant == 0x7) return std::nanf("");
  if (exp == 0)
    out = std::ldexp(static_cast<float>(mant) / 8.0f, -6);
  else
    out = std::ldexp(1.0f + static_cast<float>(mant) / 8.0f, exp - 7);
  return neg ? -out : out;
}

}  // namespace pd
