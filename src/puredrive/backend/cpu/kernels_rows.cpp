// Weight rows as the CPU kernels read them (kernels.h): each format widened or dequantised to f32, MLX affine
// codes decoded (scalar, or eight at a time with AVX2), and an affine row's dot with one input decoded in
// registers.
#include <immintrin.h>

#include <cstring>

#include "puredrive/backend/cpu/kernels.h"
#include "puredrive/backend/cpu/simd.h"
#include "puredrive/util/dtype.h"

namespace pd::cpu {
namespace {

using simd::kHasAvx2;

float scale_value(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

// Decodes 32 consecutive b-bit codes that start at a word boundary (b words).
void unpack32(const uint32_t* words, int bits, uint32_t* codes) {
  const uint32_t mask = (1u << bits) - 1u;
  if (bits == 4) {
    for (int w = 0; w < 4; ++w) {
      for (int k = 0; k < 8; ++k) codes[w * 8 + k] = (words[w] >> (4 * k)) & mask;
    }
    return;
  }
  if (bits == 8) {
    for (int w = 0; w < 8; ++w) {
      for (int k = 0; k < 4; ++k) codes[w * 4 + k] = (words[w] >> (8 * k)) & mask;
    }
    return;
  }
  uint32_t tmp[9] = {};
  std::memcpy(tmp, words, static_cast<size_t>(bits) * sizeof(uint32_t));
  for (int j = 0; j < 32; ++j) {
    const int pos = j * bits;
    const uint64_t window =
        static_cast<uint64_t>(tmp[pos >> 5]) | (static_cast<uint64_t>(tmp[(pos >> 5) + 1]) << 32);
    codes[j] = static_cast<uint32_t>(window >> (pos & 31)) & mask;
  }
}

#if PD_X86
using simd::hsum_canonical;

__attribute__((target("avx2,fma,f16c"))) void f16_row_avx2(const uint16_t* src, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
  for (; i < n; ++i) out[i] = f16_to_f32(src[i]);
}

// Eight codes of 32 consecutive ones (AVX2, as 32-bit integers): 4-bit codes from one word by variable
// shifts, 8-bit codes widened from bytes, 6-bit codes from byte windows; other widths from unpack32's
// scalar decode.
__attribute__((target("avx2,fma"))) inline __m256i codes8(const uint32_t* words, int bits, int part,
                                                          const uint32_t* unpacked) {
  if (bits == 4) {
    const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(words[part])), shifts),
                            _mm256_set1_epi32(15));
  }
  if (bits == 8) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(words + 2 * part)));
  }
  if (bits == 6) {
    // Six bytes hold the eight codes (LSB first); code k sits in the 16-bit window at byte 6k / 8, shifted by
    // 6k % 8. Read as 4 + 2 bytes, not 8: the row's last six bytes may end the matrix.
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(words) + 6 * part;
    uint32_t lo = 0;
    uint16_t hi = 0;
    std::memcpy(&lo, bytes, 4);  // two loads into registers (a 6-byte copy to the stack stalled the reload)
    std::memcpy(&hi, bytes + 4, 2);
    const uint64_t six = lo | (uint64_t{hi} << 32);
    const __m128i windows = _mm_shuffle_epi8(_mm_cvtsi64_si128(static_cast<long long>(six)),
                                             _mm_setr_epi8(0, 1, 0, 1, 1, 2, 2, 3, 3, 4, 3, 4, 4, 5, 5, 6));
    const __m256i shifts = _mm256_setr_epi32(0, 6, 4, 2, 0, 6, 4, 2);
    return _mm256_and_si256(_mm256_srlv_epi32(_mm256_cvtepu16_epi32(windows), shifts), _mm256_set1_epi32(63));
  }
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(unpacked + 8 * part));
}

// Eight dequantised weights: scale * q, then + bias, each rounded (the scalar dequantisation's bits).
__attribute__((target("avx2,fma"))) inline __m256 affine8(const uint32_t* words, int bits, int part,
                                                          const uint32_t* unpacked, __m256 scale,
                                                          __m256 bias) {
  return _mm256_add_ps(_mm256_mul_ps(scale, _mm256_cvtepi32_ps(codes8(words, bits, part, unpacked))), bias);
}

// Row r of affine m in 32-column blocks: sink.block(col, w) with w[0..3] the block's weights eight at a time,
// each made as the scalar dequantisation makes it (the integer-to-float conversion is exact, then
// _mm256_mul_ps and _mm256_add_ps round as the scalar product and sum). Groups are multiples of 32 columns.
template <typename Sink>
__attribute__((target("avx2,fma"), always_inline)) inline void affine_row_blocks(const Matrix& m, int64_t r,
                                                                                 Sink& sink) {
  const int64_t words_per_row = m.cols * m.bits / 32;
  const int64_t groups = m.cols / m.group_size;
  const uint32_t* row = static_cast<const uint32_t*>(m.data) + r * words_per_row;
  alignas(32) uint32_t codes[32];
  const bool scalar_unpack = m.bits != 4 && m.bits != 6 && m.bits != 8;
  for (int64_t g = 0; g < groups; ++g) {
    const __m256 scale = _mm256_set1_ps(scale_value(m.scales, m.scale_dtype, r * groups + g));
    const __m256 bias = _mm256_set1_ps(scale_value(m.biases, m.scale_dtype, r * groups + g));
    for (int64_t c = 0; c < m.group_size; c += 32) {
      const int64_t col = g * m.group_size + c;
      const uint32_t* words = row + col * m.bits / 32;
      if (scalar_unpack) unpack32(words, m.bits, codes);
      const __m256 w[4] = {
          affine8(words, m.bits, 0, codes, scale, bias), affine8(words, m.bits, 1, codes, scale, bias),
          affine8(words, m.bits, 2, codes, scale, bias), affine8(words, m.bits, 3, codes, scale, bias)};
      sink.block(col, w);
    }
  }
}

// The row written out (dequantize_affine_row).
struct RowStore {
  float* out;
  __attribute__((target("avx2,fma"), always_inline)) void block(int64_t col, const __m256 (&w)[4]) {
    for (int part = 0; part < 4; ++part) _mm256_storeu_ps(out + col + 8 * part, w[part]);
  }
};

// dot(x, the row) in the canonical order, the row never in memory.
struct RowDot {
  const float* x;
  __m256 a0, a1, a2, a3;
  __attribute__((target("avx2,fma"), always_inline)) void block(int64_t col, const __m256 (&w)[4]) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + col), w[0], a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + col + 8), w[1], a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + col + 16), w[2], a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + col + 24), w[3], a3);
  }
};

__attribute__((target("avx2,fma"))) void dequantize_affine_row_avx2(const Matrix& m, int64_t r, float* out) {
  RowStore sink{out};
  affine_row_blocks(m, r, sink);
}

__attribute__((target("avx2,fma"))) float dot_affine_avx2(const float* x, const Matrix& m, int64_t r) {
  RowDot sink{x, _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  affine_row_blocks(m, r, sink);
  const __m256 acc[4] = {sink.a0, sink.a1, sink.a2, sink.a3};
  return hsum_canonical(acc);
}
#endif

void dequantize_affine_row(const Matrix& m, int64_t r, float* out) {
#if PD_X86
  if (kHasAvx2) {
    dequantize_affine_row_avx2(m, r, out);
    return;
  }
#endif
  const int64_t words_per_row = m.cols * m.bits / 32;
  const int64_t groups = m.cols / m.group_size;
  const uint32_t* row = static_cast<const uint32_t*>(m.data) + r * words_per_row;
  uint32_t codes[32];
  for (int64_t g = 0; g < groups; ++g) {
    const float scale = scale_value(m.scales, m.scale_dtype, r * groups + g);
    const float bias = scale_value(m.biases, m.scale_dtype, r * groups + g);
    for (int64_t c = 0; c < m.group_size; c += 32) {
      const int64_t col = g * m.group_size + c;
      unpack32(row + col * m.bits / 32, m.bits, codes);
      for (int j = 0; j < 32; ++j) {
        const float product = scale * static_cast<float>(codes[j]);
        out[col + j] = product + bias;
      }
    }
  }
}

}  // namespace

float dot_affine_row(const float* x, const Matrix& m, int64_t r, float* buf) {
#if PD_X86
  if (kHasAvx2) return dot_affine_avx2(x, m, r);
#endif
  dequantize_affine_row(m, r, buf);
  return dot(x, buf, m.cols);
}

uint32_t affine_code(const Matrix& m, int64_t r, int64_t j) {
  const int64_t words_per_row = m.cols * m.bits / 32;
  const uint32_t* row = static_cast<const uint32_t*>(m.data) + r * words_per_row;
  const int64_t pos = j * m.bits;
  uint64_t window = row[pos >> 5];
  if ((pos & 31) + m.bits > 32) window |= static_cast<uint64_t>(row[(pos >> 5) + 1]) << 32;
  return static_cast<uint32_t>(window >> (pos & 31)) & ((1u << m.bits) - 1u);
}

void dequantize_row(const Matrix& m, int64_t r, float* out) {
  switch (m.format) {
    case WeightFormat::kF32:
      std::memcpy(out, static_cast<const float*>(m.data) + r * m.cols,
                  static_cast<size_t>(m.cols) * sizeof(float));
      return;
    case WeightFormat::kBF16: {
      const uint16_t* src = static_cast<const uint16_t*>(m.data) + r * m.cols;
      for (int64_t i = 0; i < m.cols; ++i) out[i] = bf16_to_f32(src[i]);
      return;
    }
    case WeightFormat::kF16: {
      const uint16_t* src = static_cast<const uint16_t*>(m.data) + r * m.cols;
#if PD_X86
      if (kHasAvx2) {
        f16_row_avx2(src, out, m.cols);
        return;
      }
#endif
      for (int64_t i = 0; i < m.cols; ++i) out[i] = f16_to_f32(src[i]);
      return;
    }
    case WeightFormat::kAffine:
      dequantize_affine_row(m, r, out);
      return;
  }
}

int64_t matrix_bytes(const Matrix& m) {
  switch (m.format) {
    case WeightFormat::kF32:
      return m.rows * m.cols * 4;
    case WeightFormat::kF16:
    case WeightFormat::kBF16:
      return m.rows * m.cols * 2;
    case WeightFormat::kAffine:
      return m.rows * m.cols * m.bits / 8 +
             2 * m.rows * (m.cols / m.group_size) * static_cast<int64_t>(dtype_size(m.scale_dtype));
  }
  return 0;
}

const float* matrix_row(const Matrix& m, int64_t r, float* buf) {
  if (m.format == WeightFormat::kF32) return static_cast<const float*>(m.data) + r * m.cols;
  dequantize_row(m, r, buf);
  return buf;
}

}  // namespace pd::cpu
