// Dense CPU ops: embed, rms_norm, add, matmul, argmax.
#include <cmath>
#include <limits>
#include <vector>

#include "puredrive/backend/cpu/cpu_ops.h"
#include "puredrive/backend/cpu/kernels.h"

namespace pd::cpu {

void rms_norm_row(const float* x, const float* w, int64_t n, float eps, float* out) {
  // HF Qwen3_5MoeRMSNorm: (x * rsqrt(mean(x^2) + eps)) * w, the mean as sum / n.
  const float mean = dot(x, x, n) / static_cast<float>(n);
  const float inv = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * inv) * w[i];
}

void embed(const Exec& pool, const Matrix& table, const Tensor& tokens, const Tensor& out) {
  parallel_for(pool, static_cast<size_t>(out.rows), static_cast<double>(out.cols),
               [&](size_t begin, size_t end) {
                 for (size_t r = begin; r < end; ++r) {
                   const int64_t row = static_cast<int64_t>(r);
                   dequantize_row(table, *tokens.row<int32_t>(row), out.row<float>(row));
                 }
               });
}

void rms_norm(const Exec& pool, const Tensor& x, const float* weight, float eps, const Tensor& out) {
  parallel_for(pool, static_cast<size_t>(x.rows), static_cast<double>(x.cols), [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) {
      const int64_t row = static_cast<int64_t>(r);
      rms_norm_row(x.row<float>(row), weight, x.cols, eps, out.row<float>(row));
    }
  });
}

void add(const Exec& /*pool*/, const Tensor& a, const Tensor& b, const Tensor& out) {
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* pa = a.row<float>(r);
    const float* pb = b.row<float>(r);
    float* po = out.row<float>(r);
    for (int64_t i = 0; i < a.cols; ++i) po[i] = pa[i] + pb[i];
  }
}

void matmul(const Exec& pool, const Matrix& w, const Tensor& x, const Tensor& out, Accum accum) {
  const int64_t rows = x.rows;
  const int64_t k = w.cols;
  // Output column n of every row is one canonical dot of that row with weight row n, so each weight row is
  // dequantised once per step for all rows, and no result depends on R, on the blocks or on the partition.
  std::vector<const float*> xs(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) xs[static_cast<size_t>(r)] = x.row<float>(r);
  const int nb = dot_block_rows(rows);
  const int64_t blocks = (w.rows + nb - 1) / nb;
  parallel_for(pool, static_cast<size_t>(blocks), static_cast<double>(k * rows * nb),
               [&](size_t begin, size_t end) {
                 std::vector<float> buf(static_cast<size_t>(k * nb));
                 std::vector<float> vals(static_cast<size_t>(rows * nb));
                 for (size_t b = begin; b < end; ++b) {
                   const int64_t n0 = static_cast<int64_t>(b) * nb;
                   const int count = static_cast<int>(std::min<int64_t>(nb, w.rows - n0));
                   dot_block(w, n0, count, xs.data(), rows, vals.data(), buf.data());
                   for (int64_t r = 0; r < rows; ++r) {
                     float* o = out.row<float>(r) + n0;
                     for (int i = 0; i < count; ++i) {
                       const float v = vals[static_cast<size_t>(i * rows + r)];
                       o[i] = accum == Accum::kAdd ? o[i] + v : v;
                     }
                   }
                 }
               });
}

void argmax(const Tensor& x, const Tensor& out) {
  for (int64_t r = 0; r < x.rows; ++r) {
    const float* p = x.row<float>(r);
    int32_t best = 0;
    float best_value = -std::numeric_limits<float>::infinity();
    bool found = false;
    for (int64_t i = 0; i < x.cols; ++i) {
      // Strictly greater: ties keep the lowest id; NaN compares false and never wins.
      if (p[i] > best_value || (!found && p[i] == best_value)) {
        best_value = p[i];
        best = static_cast<int32_t>(i);
        found = true;
      }
    }
    *out.row<int32_t>(r) = best;
  }
}

}  // namespace pd::cpu
