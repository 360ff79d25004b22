#include "puredrive/backend/cpu/kernels.h"

#include <immintrin.h>

#include <algorithm>

#include "puredrive/backend/cpu/simd.h"
#include "puredrive/util/dtype.h"

namespace pd::cpu {
namespace {

using simd::kHasAvx2;
#if PD_X86
using simd::hsum_canonical;
#endif

// softmax_lanes' fixed tree over its eight lane sums.
inline float softmax_lane_total(const float* l) {
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

#if PD_X86
__attribute__((target("avx2,fma"))) float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc[0]);
    acc[1] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc[1]);
    acc[2] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), acc[2]);
    acc[3] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), acc[3]);
  }
  // Tail: offset o of the last partial block goes to lane o, as in the portable path. Masked-off lanes add
  // 0*0 to a partial sum, which leaves it unchanged (a partial sum starting at +0 is never -0).
  for (int c = 0; c < 4 && i < n; ++c, i += 8) {
    const int64_t take = n - i < 8 ? n - i : 8;
    if (take == 8) {
      acc[c] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc[c]);
    } else {
      alignas(32) int32_t m[8];
      for (int l = 0; l < 8; ++l) m[l] = l < take ? -1 : 0;
      const __m256i mask = _mm256_load_si256(reinterpret_cast<const __m256i*>(m));
      acc[c] = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, mask), _mm256_maskload_ps(b + i, mask), acc[c]);
    }
  }
  return hsum_canonical(acc);
}

__attribute__((target("avx2,fma"))) inline __m256 bf16x8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx2,fma"))) float dot_bf16_avx2(const float* a, const uint16_t* b, int64_t n) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), bf16x8(b + i), acc[0]);
    acc[1] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), bf16x8(b + i + 8), acc[1]);
    acc[2] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), bf16x8(b + i + 16), acc[2]);
    acc[3] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), bf16x8(b + i + 24), acc[3]);
  }
  // Tail as in dot_avx2: zero-filled lanes add 0*0 and leave the partial sums unchanged.
  for (int c = 0; c < 4 && i < n; ++c, i += 8) {
    alignas(32) float ta[8] = {};
    alignas(16) uint16_t tb[8] = {};
    const int64_t take = n - i < 8 ? n - i : 8;
    for (int64_t l = 0; l < take; ++l) {
      ta[l] = a[i + l];
      tb[l] = b[i + l];
    }
    acc[c] = _mm256_fmadd_ps(_mm256_load_ps(ta), bf16x8(tb), acc[c]);
  }
  return hsum_canonical(acc);
}

// Eight weights as f32: f32 as stored, bf16 widened.
__attribute__((target("avx2,fma"))) inline __m256 load_w8(const float* p) {
  return _mm256_loadu_ps(p);
}
__attribute__((target("avx2,fma"))) inline __m256 load_w8(const uint16_t* p) {
  return bf16x8(p);
}

inline float widen(float v) {
  return v;
}
inline float widen(uint16_t v) {
  return bf16_to_f32(v);
}

// u . p and u . q, four lanes of the canonical order (lanes 8 c .. 8 c + 7 in a register), at once.
template <typename U, typename P>
__attribute__((target("avx2,fma"), always_inline)) inline void dot2_step(const U* u, const P* p, const P* q,
                                                                         __m256& a, __m256& b) {
  const __m256 uv = load_w8(u);
  a = _mm256_fmadd_ps(load_w8(p), uv, a);
  b = _mm256_fmadd_ps(load_w8(q), uv, b);
}

// Two canonical dots that share an operand, u . p and u . q: u's loads (and, for bf16, its conversion) serve
// both, and each keeps its own four accumulators, so every result is bitwise the single dot's (dot, or
// dot_bf16 for bf16 weights; a multiply-add does not depend on its factors' order). u is one weight row
// against two inputs (a step's rows in pairs), or one input against two bf16 weight rows (a decode step:
// the two chains overlap where one dot's was latency-bound). The tail (n % 32) goes through the single-row
// kernels' order: zero-filled lanes add 0*0.
template <typename U, typename P>
__attribute__((target("avx2,fma"))) void dot2_avx2(const U* u, const P* p, const P* q, int64_t n,
                                                   float* out_p, float* out_q) {
  // Named accumulators stay in registers; as an array, GCC at -O2 kept them in memory, and every
  // multiply-add then waited on a store and a load (prefill 1.5x slower).
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    dot2_step(u + i, p + i, q + i, a0, b0);
    dot2_step(u + i + 8, p + i + 8, q + i + 8, a1, b1);
    dot2_step(u + i + 16, p + i + 16, q + i + 16, a2, b2);
    dot2_step(u + i + 24, p + i + 24, q + i + 24, a3, b3);
  }
  __m256 a[4] = {a0, a1, a2, a3}, b[4] = {b0, b1, b2, b3};
  for (int c = 0; c < 4 && i < n; ++c, i += 8) {
    alignas(32) U tu[8] = {};
    alignas(32) P tp[8] = {}, tq[8] = {};
    const int64_t take = n - i < 8 ? n - i : 8;
    for (int64_t l = 0; l < take; ++l) {
      tu[l] = u[i + l];
      tp[l] = p[i + l];
      tq[l] = q[i + l];
    }
    const __m256 uv = load_w8(tu);
    a[c] = _mm256_fmadd_ps(load_w8(tp), uv, a[c]);
    b[c] = _mm256_fmadd_ps(load_w8(tq), uv, b[c]);
  }
  *out_p = hsum_canonical(a);
  *out_q = hsum_canonical(b);
}

// add_scaled's loop eight floats at a time: _mm256_mul_ps and _mm256_add_ps round as the scalar operations.
template <typename V>
__attribute__((target("avx2,fma"))) void add_scaled_avx2(float* acc, float p, const V* v, int64_t n) {
  const __m256 pv = _mm256_set1_ps(p);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_mul_ps(pv, load_w8(v + i))));
  }
  for (; i < n; ++i) acc[i] = acc[i] + p * widen(v[i]);
}

__attribute__((target("avx2,fma"))) void decay_row_avx2(float* s, float alpha, float c, float* acc,
                                                        int64_t n) {
  const __m256 av = _mm256_set1_ps(alpha), cv = _mm256_set1_ps(c);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 sv = _mm256_mul_ps(_mm256_loadu_ps(s + j), av);
    _mm256_storeu_ps(s + j, sv);
    _mm256_storeu_ps(acc + j, _mm256_add_ps(_mm256_loadu_ps(acc + j), _mm256_mul_ps(sv, cv)));
  }
  for (; j < n; ++j) {
    s[j] = s[j] * alpha;
    acc[j] = acc[j] + s[j] * c;
  }
}

__attribute__((target("avx2,fma"))) void update_row_avx2(float* s, float c, const float* d, float q,
                                                         float* acc, int64_t n) {
  const __m256 cv = _mm256_set1_ps(c), qv = _mm256_set1_ps(q);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 sv = _mm256_add_ps(_mm256_loadu_ps(s + j), _mm256_mul_ps(cv, _mm256_loadu_ps(d + j)));
    _mm256_storeu_ps(s + j, sv);
    _mm256_storeu_ps(acc + j, _mm256_add_ps(_mm256_loadu_ps(acc + j), _mm256_mul_ps(sv, qv)));
  }
  for (; j < n; ++j) {
    s[j] = s[j] + c * d[j];
    acc[j] = acc[j] + s[j] * q;
  }
}

// fma_product's terms in its order, 64, 32 or 8 columns at a time (_mm256_fmadd_ps rounds once, as std::fma).
__attribute__((target("avx2,fma"))) void fma_product_avx2(int rows, int cols_all, int col_band, int depth,
                                                          int band, FmaOperand a, FmaOperand b, float* c,
                                                          int64_t ldc, bool accumulate) {
  for (int r = 0; r < rows; ++r) {
    const int k_end = std::min(depth, r + band);
    const int cols = std::min(cols_all, r + col_band);
    float* cr = c + r * ldc;
    const float* ar = a.p + r * a.ld;
    int j = 0;
    // Named accumulators stay in registers (an array of them is kept in memory at -O2); eight independent
    // chains hide the FMA latency.
    for (; j + 64 <= cols; j += 64) {
      __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
      if (accumulate) {
        s0 = _mm256_loadu_ps(cr + j);
        s1 = _mm256_loadu_ps(cr + j + 8);
        s2 = _mm256_loadu_ps(cr + j + 16);
        s3 = _mm256_loadu_ps(cr + j + 24);
        s4 = _mm256_loadu_ps(cr + j + 32);
        s5 = _mm256_loadu_ps(cr + j + 40);
        s6 = _mm256_loadu_ps(cr + j + 48);
        s7 = _mm256_loadu_ps(cr + j + 56);
      }
      for (int k = 0; k < k_end; ++k) {
        const __m256 x = _mm256_set1_ps(ar[k]);
        const float* bk = b.p + k * b.ld + j;
        s0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(bk), s0);
        s1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(bk + 8), s1);
        s2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(bk + 16), s2);
        s3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(bk + 24), s3);
        s4 = _mm256_fmadd_ps(x, _mm256_loadu_ps(bk + 32), s4);
        s5 = _mm256_fmadd_ps(x, _mm256_loadu_ps(bk + 40), s5);
        s6 = _mm256_fmadd_ps(x, _mm256_loadu_ps(bk + 48), s6);
        s7 = _mm256_fmadd_ps(x, _mm256_loadu_ps(bk + 56), s7);
      }
      _mm256_storeu_ps(cr + j, s0);
      _mm256_storeu_ps(cr + j + 8, s1);
      _mm256_storeu_ps(cr + j + 16, s2);
      _mm256_storeu_ps(cr + j + 24, s3);
      _mm256_storeu_ps(cr + j + 32, s4);
      _mm256_storeu_ps(cr + j + 40, s5);
      _mm256_storeu_ps(cr + j + 48, s6);
      _mm256_storeu_ps(cr + j + 56, s7);
    }
    for (; j + 32 <= cols; j += 32) {
      __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
      if (accumulate) {
        s0 = _mm256_loadu_ps(cr + j);
        s1 = _mm256_loadu_ps(cr + j + 8);
        s2 = _mm256_loadu_ps(cr + j + 16);
        s3 = _mm256_loadu_ps(cr + j + 24);
      }
      for (int k = 0; k < k_end; ++k) {
        const __m256 x = _mm256_set1_ps(ar[k]);
        const float* bk = b.p + k * b.ld + j;
        s0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(bk), s0);
        s1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(bk + 8), s1);
        s2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(bk + 16), s2);
        s3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(bk + 24), s3);
      }
      _mm256_storeu_ps(cr + j, s0);
      _mm256_storeu_ps(cr + j + 8, s1);
      _mm256_storeu_ps(cr + j + 16, s2);
      _mm256_storeu_ps(cr + j + 24, s3);
    }
    for (; j + 8 <= cols; j += 8) {
      __m256 s = accumulate ? _mm256_loadu_ps(cr + j) : _mm256_setzero_ps();
      for (int k = 0; k < k_end; ++k) {
        s = _mm256_fmadd_ps(_mm256_set1_ps(ar[k]), _mm256_loadu_ps(b.p + k * b.ld + j), s);
      }
      _mm256_storeu_ps(cr + j, s);
    }
    for (; j < cols; ++j) {
      float s = accumulate ? cr[j] : 0.0f;
      for (int k = 0; k < k_end; ++k) s = std::fma(ar[k], b.p[k * b.ld + j], s);
      cr[j] = s;
    }
  }
}

// softmax_lanes' passes 1 and 3 eight floats at a time (max is exact in any order; _mm256_mul_ps and
// _mm256_div_ps round as the scalar operations), the eight lane sums of pass 2 as vectors.
__attribute__((target("avx2,fma"))) void softmax_lanes_avx2(float* sc, int64_t n, float scale) {
  const int64_t full = n / 8 * 8;
  const __m256 sv = _mm256_set1_ps(scale);
  __m256 mv = _mm256_set1_ps(-INFINITY);
  for (int64_t t = 0; t < full; t += 8) {
    const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(sc + t), sv);
    _mm256_storeu_ps(sc + t, x);
    mv = _mm256_max_ps(mv, x);
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, mv);
  float mx = lanes[0];
  for (int l = 1; l < 8; ++l) mx = std::max(mx, lanes[l]);
  for (int64_t t = full; t < n; ++t) {
    sc[t] = sc[t] * scale;
    mx = std::max(mx, sc[t]);
  }
  __m256 acc = _mm256_setzero_ps();
  for (int64_t t = 0; t < full; t += 8) {
    for (int l = 0; l < 8; ++l) sc[t + l] = std::exp(sc[t + l] - mx);
    acc = _mm256_add_ps(acc, _mm256_loadu_ps(sc + t));
  }
  _mm256_storeu_ps(lanes, acc);
  for (int64_t t = full; t < n; ++t) {
    sc[t] = std::exp(sc[t] - mx);
    lanes[t - full] = lanes[t - full] + sc[t];
  }
  const float sum = softmax_lane_total(lanes);
  const __m256 dv = _mm256_set1_ps(sum);
  for (int64_t t = 0; t < full; t += 8) _mm256_storeu_ps(sc + t, _mm256_div_ps(_mm256_loadu_ps(sc + t), dv));
  for (int64_t t = full; t < n; ++t) sc[t] = sc[t] / sum;
}
#endif

}  // namespace

bool has_avx2() {
  return kHasAvx2;
}

float dot_portable(const float* a, const float* b, int64_t n) {
  float acc[32] = {};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int l = 0; l < 32; ++l) acc[l] = std::fma(a[i + l], b[i + l], acc[l]);
  }
  for (int64_t o = 0; i + o < n; ++o) acc[o] = std::fma(a[i + o], b[i + o], acc[o]);
  float t[8];
  for (int l = 0; l < 8; ++l) t[l] = (acc[l] + acc[8 + l]) + (acc[16 + l] + acc[24 + l]);
  float s4[4];
  for (int l = 0; l < 4; ++l) s4[l] = t[l] + t[l + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

void fma_product_portable(int rows, int cols, int col_band, int depth, int band, FmaOperand a, FmaOperand b,
                          float* c, int64_t ldc, bool accumulate) {
  for (int r = 0; r < rows; ++r) {
    const int k_end = std::min(depth, r + band);
    const int cols_r = std::min(cols, r + col_band);
    float* cr = c + r * ldc;
    const float* ar = a.p + r * a.ld;
    for (int j = 0; j < cols_r; ++j) {
      float s = accumulate ? cr[j] : 0.0f;
      for (int k = 0; k < k_end; ++k) s = std::fma(ar[k], b.p[k * b.ld + j], s);
      cr[j] = s;
    }
  }
}

void fma_product(int rows, int cols, int col_band, int depth, int band, FmaOperand a, FmaOperand b, float* c,
                 int64_t ldc, bool accumulate) {
#if PD_X86
  if (kHasAvx2) {
    fma_product_avx2(rows, cols, col_band, depth, band, a, b, c, ldc, accumulate);
    return;
  }
#endif
  fma_product_portable(rows, cols, col_band, depth, band, a, b, c, ldc, accumulate);
}

float dot(const float* a, const float* b, int64_t n) {
#if PD_X86
  if (kHasAvx2) return dot_avx2(a, b, n);
#endif
  return dot_portable(a, b, n);
}

float dot_bf16(const float* a, const uint16_t* b, int64_t n) {
#if PD_X86
  if (kHasAvx2) return dot_bf16_avx2(a, b, n);
#endif
  float acc[32] = {};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int l = 0; l < 32; ++l) acc[l] = std::fma(a[i + l], bf16_to_f32(b[i + l]), acc[l]);
  }
  for (int64_t o = 0; i + o < n; ++o) acc[o] = std::fma(a[i + o], bf16_to_f32(b[i + o]), acc[o]);
  float t[8];
  for (int l = 0; l < 8; ++l) t[l] = (acc[l] + acc[8 + l]) + (acc[16 + l] + acc[24 + l]);
  float s4[4];
  for (int l = 0; l < 4; ++l) s4[l] = t[l] + t[l + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

void dot2(const float* x0, const float* x1, const float* w, int64_t n, float* out0, float* out1) {
#if PD_X86
  if (kHasAvx2) {
    dot2_avx2(w, x0, x1, n, out0, out1);
    return;
  }
#endif
  *out0 = dot_portable(x0, w, n);
  *out1 = dot_portable(x1, w, n);
}

void add_scaled(float* acc, float p, const float* v, int64_t n) {
#if PD_X86
  if (kHasAvx2) {
    add_scaled_avx2(acc, p, v, n);
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) acc[i] = acc[i] + p * v[i];
}

void add_scaled_bf16(float* acc, float p, const uint16_t* v, int64_t n) {
#if PD_X86
  if (kHasAvx2) {
    add_scaled_avx2(acc, p, v, n);
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) acc[i] = acc[i] + p * bf16_to_f32(v[i]);
}

void decay_row(float* s, float alpha, float c, float* acc, int64_t n) {
#if PD_X86
  if (kHasAvx2) {
    decay_row_avx2(s, alpha, c, acc, n);
    return;
  }
#endif
  for (int64_t j = 0; j < n; ++j) {
    s[j] = s[j] * alpha;
    acc[j] = acc[j] + s[j] * c;
  }
}

void softmax_lanes(float* sc, int64_t n, float scale) {
#if PD_X86
  if (kHasAvx2) {
    softmax_lanes_avx2(sc, n, scale);
    return;
  }
#endif
  float mx = -INFINITY;
  for (int64_t t = 0; t < n; ++t) {
    sc[t] = sc[t] * scale;
    mx = std::max(mx, sc[t]);
  }
  float lanes[8] = {};
  for (int64_t t = 0; t < n; ++t) {
    sc[t] = std::exp(sc[t] - mx);
    lanes[t % 8] = lanes[t % 8] + sc[t];
  }
  const float sum = softmax_lane_total(lanes);
  for (int64_t t = 0; t < n; ++t) sc[t] = sc[t] / sum;
}

void update_row(float* s, float c, const float* d, float q, float* acc, int64_t n) {
#if PD_X86
  if (kHasAvx2) {
    update_row_avx2(s, c, d, q, acc, n);
    return;
  }
#endif
  for (int64_t j = 0; j < n; ++j) {
    s[j] = s[j] + c * d[j];
    acc[j] = acc[j] + s[j] * q;
  }
}

namespace {

// Weight row r of m as the dots read it: bf16 as stored (widened in registers), anything else as f32 (a
// pointer into f32 weights, or the row dequantised into buf).
struct RowRef {
  const uint16_t* bf16 = nullptr;
  const float* f32 = nullptr;
};

RowRef row_ref(const Matrix& m, int64_t r, float* buf) {
  if (m.format == WeightFormat::kBF16) return {.bf16 = static_cast<const uint16_t*>(m.data) + r * m.cols};
  return {.f32 = matrix_row(m, r, buf)};
}

void dot_ref(const RowRef& w, int64_t n, const float* const* xs, int64_t count, float* out) {
  int64_t i = 0;
  if (w.bf16 != nullptr) {
#if PD_X86
    if (kHasAvx2) {
      for (; i + 2 <= count; i += 2) dot2_avx2(w.bf16, xs[i], xs[i + 1], n, &out[i], &out[i + 1]);
    }
#endif
    for (; i < count; ++i) out[i] = dot_bf16(xs[i], w.bf16, n);
    return;
  }
  for (; i + 2 <= count; i += 2) dot2(xs[i], xs[i + 1], w.f32, n, &out[i], &out[i + 1]);
  for (; i < count; ++i) out[i] = dot(xs[i], w.f32, n);
}

}  // namespace

void dot_row(const Matrix& m, int64_t r, const float* const* xs, int64_t count, float* out, float* buf) {
  if (count == 1 && m.format == WeightFormat::kAffine) {
    out[0] = dot_affine_row(xs[0], m, r, buf);
    return;
  }
  dot_ref(row_ref(m, r, buf), m.cols, xs, count, out);
}

void dot_block(const Matrix& m, int64_t r0, int nb, const float* const* xs, int64_t count, float* out,
               float* buf) {
  if (count % 2 == 1 && count < kDotBlockInputs) {
#if PD_X86
    if (kHasAvx2 && m.format == WeightFormat::kBF16) {
      // An odd input count (a decode step, a verify step of 3 rows): the inputs but the last in pairs per
      // weight row (dot_ref), the last against pairs of weight rows.
      const uint16_t* w = static_cast<const uint16_t*>(m.data) + r0 * m.cols;
      const int64_t last = count - 1;
      int i = 0;
      for (; i + 2 <= nb; i += 2) {
        const uint16_t *w0 = w + i * m.cols, *w1 = w0 + m.cols;
        dot_ref({.bf16 = w0}, m.cols, xs, last, out + i * count);
        dot_ref({.bf16 = w1}, m.cols, xs, last, out + (i + 1) * count);
        dot2_avx2(xs[last], w0, w1, m.cols, out + i * count + last, out + (i + 1) * count + last);
      }
      if (i < nb) dot_ref({.bf16 = w + i * m.cols}, m.cols, xs, count, out + i * count);
      return;
    }
#endif
    // Other formats row by row (an affine row meets one input decoded in registers).
    for (int i = 0; i < nb; ++i) dot_row(m, r0 + i, xs, count, out + i * count, buf);
    return;
  }
  if (nb == 1) {
    dot_row(m, r0, xs, count, out, buf);
    return;
  }
  RowRef rows[kDotBlockRows];
  for (int i = 0; i < nb; ++i) rows[i] = row_ref(m, r0 + i, buf + i * m.cols);
  // Inputs in slices of about 256 KB, so that each weight row of the block reads them from cache.
  const int64_t slice = std::max<int64_t>(2, (int64_t{256} << 10) / (4 * m.cols)) & ~int64_t{1};
  for (int64_t x0 = 0; x0 < count; x0 += slice) {
    const int64_t n = std::min(slice, count - x0);
    for (int i = 0; i < nb; ++i) dot_ref(rows[i], m.cols, xs + x0, n, out + i * count + x0);
  }
}

int dot_block_rows(int64_t inputs) {
  // Fewer inputs: an odd one's bf16 dots go in pairs of weight rows (dot_block).
  return inputs >= kDotBlockInputs ? kDotBlockRows : inputs % 2 == 1 ? 4 : 1;
}

}  // namespace pd::cpu
