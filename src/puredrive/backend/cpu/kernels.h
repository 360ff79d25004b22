// Low-level CPU kernels shared by the ops: the canonical dot product and row dequantisation.
//
// Every reduction of the CPU backend goes through dot(), whose summation order is fixed by n alone: element i
// is accumulated with a fused multiply-add into partial sum (i mod 32) (the tail continues the same lane
// numbering from lane 0), and the 32 partial sums are combined by one fixed tree. The AVX2+FMA path and the
// portable path implement exactly this order, so results are bitwise identical whichever runs, whatever the
// number of rows or threads.
#pragma once

#include <cmath>
#include <cstdint>

#include "puredrive/checkpoint/weights.h"

namespace pd::cpu {

// sum_i a[i] * b[i] in the canonical order.
float dot(const float* a, const float* b, int64_t n);
// The portable implementation of the same order (exposed for tests).
float dot_portable(const float* a, const float* b, int64_t n);
// dot(x0, w) and dot(x1, w) with shared loads of w, each bitwise the canonical dot.
void dot2(const float* x0, const float* x1, const float* w, int64_t n, float* out0, float* out1);
// dot(a, bf16 -> f32 of b) with b converted on the fly; bitwise equal to converting b first (the conversion
// is exact and the order is the canonical one).
float dot_bf16(const float* a, const uint16_t* b, int64_t n);
// acc[i] = acc[i] + p * v[i] for i < n, the product and the sum each rounded (no fused multiply-add), with v
// f32 or bf16 (widened exactly): every path gives the bits of that scalar loop.
void add_scaled(float* acc, float p, const float* v, int64_t n);
void add_scaled_bf16(float* acc, float p, const uint16_t* v, int64_t n);
// The two row updates of the gated delta rule's state S (one key row s of Dv values), element by element,
// each product and sum rounded on its own (every path gives the scalar loop's bits):
//   decay_row:  s[j] = s[j] * alpha;    acc[j] = acc[j] + s[j] * c
//   update_row: s[j] = s[j] + c * d[j]; acc[j] = acc[j] + s[j] * q
void decay_row(float* s, float alpha, float c, float* acc, int64_t n);
void update_row(float* s, float c, const float* d, float q, float* acc, int64_t n);
// A prefill row's softmax in place: x[t] = sc[t] * scale, then exp(x[t] - max x) / sum, the exponentials
// summed in eight lanes (term t into lane t mod 8) combined by a fixed tree, so the sum is no chain of n
// dependent additions. Its bits depend only on n and the values, on every path; they are not the decode
// rows' (attention.cpp sums those in ascending order).
void softmax_lanes(float* sc, int64_t n, float scale);
// Dot products of weight row r of m with each of the vectors xs[0..count), into out[0..count). Fuses the
// conversion for bf16 rows, otherwise dequantises once into buf (m.cols floats); every variant gives the
// canonical dot's bits.
void dot_row(const Matrix& m, int64_t r, const float* const* xs, int64_t count, float* out, float* buf);
// dot_row for weight rows r0 .. r0 + nb - 1 (nb <= kDotBlockRows), row r0 + i into out[i * count ..]; buf
// holds nb * m.cols floats. Each row is dequantised once and the inputs are taken in cache-sized slices, so
// long prefill steps do not stream every input once per weight row. The same bits as dot_row.
constexpr int kDotBlockRows = 16;
constexpr int kDotBlockInputs = 16;  // inputs from which blocks of kDotBlockRows pay
void dot_block(const Matrix& m, int64_t r0, int nb, const float* const* xs, int64_t count, float* out,
               float* buf);
// Weight rows per dot_block for `inputs` vectors: blocks pay when the inputs outgrow a weight row's reuse in
// registers, and for an odd count (a decode step, a verify step of 3 rows), whose last input meets bf16 rows
// in pairs; even counts keep one weight row per work item (finer parallel split).
int dot_block_rows(int64_t inputs);

// A row-major operand of fma_product: element (r, c) at p[r * ld + c].
struct FmaOperand {
  const float* p;
  int64_t ld;
};
// C[r][j] = (accumulate ? C[r][j] : 0) + sum over k < min(depth, r + band) of A[r][k] * B[k][j], one fused
// multiply-add per term in ascending k, for the columns j < min(cols, r + col_band) of each row r (others are
// left alone). band = depth and col_band = cols: the full product; band 0 / 1: A strictly lower / lower
// triangular. The order depends only on the element's own row and column, and both paths round alike.
void fma_product(int rows, int cols, int col_band, int depth, int band, FmaOperand a, FmaOperand b, float* c,
                 int64_t ldc, bool accumulate);
// The portable implementation (exposed for tests).
void fma_product_portable(int rows, int cols, int col_band, int depth, int band, FmaOperand a, FmaOperand b,
                          float* c, int64_t ldc, bool accumulate);
// True when the AVX2+FMA paths are in use.
bool has_avx2();

// Row r of m as f32: for f32 matrices a pointer into the weights, otherwise row r dequantised into buf
// (m.cols floats). MLX affine: w = scale * q + bias in f32 (one product, one sum, no fused rounding).
const float* matrix_row(const Matrix& m, int64_t r, float* buf);
void dequantize_row(const Matrix& m, int64_t r, float* out);
// dot(x, row r of affine m) in the canonical order: with AVX2 the row is decoded in registers (a decode
// step's one input), not written to buf and read back; otherwise dequantised into buf (m.cols floats).
float dot_affine_row(const float* x, const Matrix& m, int64_t r, float* buf);
// Bytes of m read by one pass (codes + scales + biases for affine).
int64_t matrix_bytes(const Matrix& m);

// The unsigned code j (0 <= j < m.cols) of row r of an affine matrix: bits [j*b, (j+1)*b) of the row's
// little-endian bit stream.
uint32_t affine_code(const Matrix& m, int64_t r, int64_t j);

// Numerically shared helpers (one definition so every op rounds the same way).
inline float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}
inline float silu(float x) {
  return x / (1.0f + std::exp(-x));
}
// PyTorch's softplus (beta 1, threshold 20).
inline float softplus(float x) {
  return x > 20.0f ? x : std::log1p(std::exp(x));
}

}  // namespace pd::cpu
