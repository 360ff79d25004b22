// Gated full attention after the projections (spec §4; HF Qwen3_5MoeAttention.forward with eager attention).
#include <algorithm>
#include <cmath>
#include <vector>

#include "puredrive/backend/cpu/cpu_ops.h"
#include "puredrive/backend/cpu/kernels.h"
#include "puredrive/util/dtype.h"

namespace pd::cpu {
namespace {

// cos/sin of the rotary frequencies at one position, as HF computes them in f32:
// inv_freq_j = 1 / theta^(2j / rotary_dim), angle = position * inv_freq_j.
void rope_tables(double theta, int rotary_dim, int32_t position, float* cos_out, float* sin_out) {
  const int half = rotary_dim / 2;
  for (int j = 0; j < half; ++j) {
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(rotary_dim);
    const float inv_freq = 1.0f / std::pow(static_cast<float>(theta), exponent);
    const float angle = static_cast<float>(position) * inv_freq;
    cos_out[j] = std::cos(angle);
    sin_out[j] = std::sin(angle);
  }
}

// NeoX rotate-half on the first rotary_dim dims: x' = x * cos + rotate_half(x) * sin, where dim i pairs with
// dim i + rotary_dim/2. Dims past rotary_dim pass through.
void apply_rope(float* x, int rotary_dim, const float* c, const float* s) {
  const int half = rotary_dim / 2;
  for (int i = 0; i < half; ++i) {
    const float lo = x[i];
    const float hi = x[i + half];
    x[i] = lo * c[i] - hi * s[i];
    x[i + half] = hi * c[i] + lo * s[i];
  }
}

void store_row(const Tensor& cache, int64_t position, const float* src) {
  if (cache.dtype == DType::kF32) {
    std::copy(src, src + cache.cols, cache.row<float>(position));
  } else {
    uint16_t* dst = cache.row<uint16_t>(position);
    for (int64_t i = 0; i < cache.cols; ++i) dst[i] = f32_to_bf16(src[i]);
  }
}

// q . (cached key of KV head h at position t): the canonical dot, a bf16 key widened exactly on the fly.
float key_dot(const Tensor& cache, int64_t t, int h, int d, const float* q) {
  if (cache.dtype == DType::kF32) return dot(q, cache.row<float>(t) + static_cast<int64_t>(h) * d, d);
  return dot_bf16(q, cache.row<uint16_t>(t) + static_cast<int64_t>(h) * d, d);
}

// acc += p * (cached value of KV head h at position t), each element a product then a sum.
void add_value(float* acc, float p, const Tensor& cache, int64_t t, int h, int d) {
  if (cache.dtype == DType::kF32) {
    add_scaled(acc, p, cache.row<float>(t) + static_cast<int64_t>(h) * d, d);
  } else {
    add_scaled_bf16(acc, p, cache.row<uint16_t>(t) + static_cast<int64_t>(h) * d, d);
  }
}

// sc[0..n) in place by its softmax: the max, then each exp(s - max) summed in ascending order, then divided.
void softmax(float* sc, int64_t n) {
  float mx = sc[0];
  for (int64_t t = 1; t < n; ++t) mx = std::max(mx, sc[t]);
  float sum = 0.0f;
  for (int64_t t = 0; t < n; ++t) {
    sc[t] = std::exp(sc[t] - mx);
    sum += sc[t];
  }
  for (int64_t t = 0; t < n; ++t) sc[t] = sc[t] / sum;
}

// Whether a step's rows sit at consecutive positions (a prefill piece always does).
bool consecutive(const Tensor& positions) {
  const int32_t first = *positions.row<int32_t>(0);
  for (int64_t r = 1; r < positions.rows; ++r) {
    if (*positions.row<int32_t>(r) != first + r) return false;
  }
  return true;
}

constexpr int kQueryBlock = 64;  // prefill rows per work item
constexpr int kKeyBlock = 64;    // cache entries widened per copy

// Keys [key0, key0 + n) of KV head h widened to f32: transposed (kt[i * kKeyBlock + j] = dim i of key j), the
// B operand of the scores' product, or as rows (values, vt[j * d + i]).
void widen_block(const Tensor& cache, int64_t key0, int64_t n, int h, int d, bool transpose, float* out) {
  for (int64_t j = 0; j < n; ++j) {
    const int64_t at = static_cast<int64_t>(h) * d;
    for (int i = 0; i < d; ++i) {
      const float v = cache.dtype == DType::kF32 ? cache.row<float>(key0 + j)[at + i]
                                                 : bf16_to_f32(cache.row<uint16_t>(key0 + j)[at + i]);
      out[transpose ? i * kKeyBlock + j : j * d + i] = v;
    }
  }
}

// Phase 2 of a prefill piece (rows at consecutive positions, no window): blocks of kQueryBlock rows meet
// blocks of kKeyBlock cache entries on fma_product, so that each entry is widened once per block of rows, not
// once per row. A row's sums still depend only on its position: each score is one multiply-add chain over
// the head dims, each softmax normaliser softmax_lanes' sum, each output element one chain over the positions
// 0 .. pos in ascending order (the bands stop every row at its own position), whichever rows share its
// block; so pieces of any size give the same bits (docs/DESIGN.md §4.6). Not the bits of a decode step's row
// (its dots take the canonical 32-lane order).
void prefill_attention(const Exec& pool, const GatedAttentionArgs& a, const std::vector<float>& q,
                       float scale) {
  const int d = a.dims.head_dim, hq = a.dims.num_heads, hkv = a.dims.num_kv_heads, group = hq / hkv;
  const int64_t rows = a.qg.rows;
  const int64_t pos0 = *a.positions.row<int32_t>(0);
  const int64_t blocks = (rows + kQueryBlock - 1) / kQueryBlock;
  parallel_for(pool, static_cast<size_t>(blocks * hkv), 2.0 * kQueryBlock * group * d * (pos0 + rows),
               [&](size_t begin, size_t end) {
                 std::vector<float> kt(static_cast<size_t>(d) * kKeyBlock), vt(kt.size());
                 std::vector<float> scores, out(static_cast<size_t>(group) * kQueryBlock * d);
                 for (size_t item = begin; item < end; ++item) {
                   const int kvh = static_cast<int>(static_cast<int64_t>(item) % hkv);
                   const int64_t r0 = static_cast<int64_t>(item) / hkv * kQueryBlock;
                   const int nq = static_cast<int>(std::min<int64_t>(kQueryBlock, rows - r0));
                   const int64_t keys = pos0 + r0 + nq;  // the block's last row reads keys [0, keys)
                   scores.resize(static_cast<size_t>(group) * kQueryBlock * keys);
                   // Row i of the block (position pos0 + r0 + i) reads keys j < pos0 + r0 + i + 1: in a block
                   // starting at key0 that is columns (or depth) < i + band.
                   for (int64_t key0 = 0; key0 < keys; key0 += kKeyBlock) {
                     const int nk = static_cast<int>(std::min<int64_t>(kKeyBlock, keys - key0));
                     const int band = static_cast<int>(pos0 + r0 + 1 - key0);
                     widen_block(a.cache.k, key0, nk, kvh, d, true, kt.data());
                     for (int g = 0; g < group; ++g) {
                       const int h = kvh * group + g;
                       float* sg = scores.data() + static_cast<int64_t>(g) * kQueryBlock * keys;
                       fma_product(nq, nk, band, d, d, {q.data() + (r0 * hq + h) * d, int64_t{hq} * d},
                                   {kt.data(), kKeyBlock}, sg + key0, keys, false);
                     }
                   }
                   for (int g = 0; g < group; ++g) {
                     for (int i = 0; i < nq; ++i) {
                       float* sc = scores.data() + (static_cast<int64_t>(g) * kQueryBlock + i) * keys;
                       softmax_lanes(sc, pos0 + r0 + i + 1, scale);
                     }
                   }
                   for (int64_t key0 = 0; key0 < keys; key0 += kKeyBlock) {
                     const int nk = static_cast<int>(std::min<int64_t>(kKeyBlock, keys - key0));
                     const int band = static_cast<int>(pos0 + r0 + 1 - key0);
                     widen_block(a.cache.v, key0, nk, kvh, d, false, vt.data());
                     for (int g = 0; g < group; ++g) {
                       const float* pg = scores.data() + static_cast<int64_t>(g) * kQueryBlock * keys + key0;
                       fma_product(nq, d, d, nk, band, {pg, keys}, {vt.data(), d},
                                   out.data() + static_cast<int64_t>(g) * kQueryBlock * d, d, key0 > 0);
                     }
                   }
                   for (int i = 0; i < nq; ++i) {
                     for (int g = 0; g < group; ++g) {
                       const int h = kvh * group + g;
                       const float* gate = a.qg.row<float>(r0 + i) + int64_t{h} * 2 * d + d;
                       float* o = a.out.row<float>(r0 + i) + int64_t{h} * d;
                       const float* ag = out.data() + (static_cast<int64_t>(g) * kQueryBlock + i) * d;
                       for (int e = 0; e < d; ++e) o[e] = ag[e] * sigmoid(gate[e]);
                     }
                   }
                 }
               });
}

}  // namespace

void gated_attention(const Exec& pool, const GatedAttentionArgs& a, const float* q_norm,
                     const float* k_norm) {
  const AttentionDims& dims = a.dims;
  const int d = dims.head_dim;
  const int hq = dims.num_heads;
  const int hkv = dims.num_kv_heads;
  const int group = hq / hkv;
  const int64_t rows = a.qg.rows;
  const int half = dims.rotary_dim / 2;

  // Phase 1, per row: normalised and rotated queries; keys and values written at the row's position.
  std::vector<float> q(static_cast<size_t>(rows * hq * d));
  parallel_for(pool, static_cast<size_t>(rows), 4.0 * (hq + hkv) * d, [&](size_t begin, size_t end) {
    std::vector<float> c(static_cast<size_t>(half) + 1), s(static_cast<size_t>(half) + 1);
    std::vector<float> k(static_cast<size_t>(hkv) * d);
    for (size_t rr = begin; rr < end; ++rr) {
      const int64_t r = static_cast<int64_t>(rr);
      const int32_t pos = *a.positions.row<int32_t>(r);
      rope_tables(dims.rope_theta, dims.rotary_dim, pos, c.data(), s.data());
      const float* qg = a.qg.row<float>(r);
      for (int h = 0; h < hq; ++h) {
        float* qh = q.data() + (r * hq + h) * d;
        rms_norm_row(qg + int64_t{h} * 2 * d, q_norm, d, dims.eps, qh);
        apply_rope(qh, dims.rotary_dim, c.data(), s.data());
      }
      for (int h = 0; h < hkv; ++h) {
        float* kh = k.data() + int64_t{h} * d;
        rms_norm_row(a.k.row<float>(r) + int64_t{h} * d, k_norm, d, dims.eps, kh);
        apply_rope(kh, dims.rotary_dim, c.data(), s.data());
      }
      store_row(a.cache.k, pos, k.data());
      store_row(a.cache.v, pos, a.v.row<float>(r));
    }
  });

  // Phase 2, per (row, KV head): softmax(q K^T * D^-1/2) V over positions [first, pos] in ascending order
  // for each query head of the group (first = 0, or the window's start), then the sigmoid output gate. The
  // order depends only on the row's position.
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  if (a.prefill && a.window == 0 && consecutive(a.positions)) {
    prefill_attention(pool, a, q, scale);
    return;
  }
  const double context = 1.0 + *a.positions.row<int32_t>(rows - 1);
  parallel_for(
      pool, static_cast<size_t>(rows * hkv), 2.0 * group * d * context, [&](size_t begin, size_t end) {
        std::vector<float> scores;
        std::vector<float> acc(static_cast<size_t>(group) * d);
        for (size_t item = begin; item < end; ++item) {
          const int64_t r = static_cast<int64_t>(item) / hkv;
          const int kvh = static_cast<int>(static_cast<int64_t>(item) % hkv);
          const int64_t pos = *a.positions.row<int32_t>(r);
          const int64_t first = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
          const int64_t n = pos - first + 1;
          const float* qr = q.data() + (r * hq + int64_t{kvh} * group) * d;
          scores.resize(static_cast<size_t>(n * group));
          for (int64_t t = 0; t < n; ++t) {
            for (int g = 0; g < group; ++g)
              scores[g * n + t] = key_dot(a.cache.k, first + t, kvh, d, qr + int64_t{g} * d) * scale;
          }
          for (int g = 0; g < group; ++g) softmax(scores.data() + g * n, n);
          // Each output element sums its terms in ascending position.
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int64_t t = 0; t < n; ++t) {
            for (int g = 0; g < group; ++g)
              add_value(acc.data() + int64_t{g} * d, scores[g * n + t], a.cache.v, first + t, kvh, d);
          }
          for (int g = 0; g < group; ++g) {
            const int h = kvh * group + g;
            const float* gate = a.qg.row<float>(r) + int64_t{h} * 2 * d + d;
            float* o = a.out.row<float>(r) + int64_t{h} * d;
            const float* ag = acc.data() + int64_t{g} * d;
            for (int i = 0; i < d; ++i) o[i] = ag[i] * sigmoid(gate[i]);
          }
        }
      });
}

}  // namespace pd::cpu
