// Gated DeltaNet after the input projections (spec §5; HF Qwen3_5MoeGatedDeltaNet.forward with
// causal_conv1d_update and torch_recurrent_gated_delta_rule, token by token, fp32 state). Prefill steps
// share the conv and hand the rest to the chunked form (gdn_chunked.cpp).
#include <algorithm>
#include <cmath>
#include <vector>

#include "puredrive/backend/cpu/cpu_ops.h"
#include "puredrive/backend/cpu/kernels.h"

namespace pd::cpu {

void l2norm(const float* x, int64_t n, float scale, float* out) {
  const float inv = 1.0f / std::sqrt(dot(x, x, n) + 1e-6f);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv;
  if (scale != 1.0f) {
    for (int64_t i = 0; i < n; ++i) out[i] = out[i] * scale;
  }
}

void gdn_gated_norm(const float* o, const float* z, const float* w, int dv, float eps, float* out) {
  const float inv = 1.0f / std::sqrt(dot(o, o, dv) / static_cast<float>(dv) + eps);
  for (int j = 0; j < dv; ++j) out[j] = (w[j] * (o[j] * inv)) * silu(z[j]);
}

namespace {

// Causal depthwise conv + SiLU for channels [c0, c1) over all rows, carrying the window in the state:
// out[r, c] = silu(sum_j w[c, j] * window_r[c, j]) with window_r = [state (Kc-1 oldest first), x_r].
void conv_channels(const GatedDeltaNetArgs& a, const GdnVectors& v, int64_t c0, int64_t c1, float* conv_out) {
  const int kc = a.dims.conv_kernel;
  const int64_t channels = a.qkv.cols;
  const int64_t rows = a.qkv.rows;
  float* state = a.state.conv.row<float>(0);  // [Kc-1, C]
  std::vector<float> window(static_cast<size_t>(kc));
  for (int64_t c = c0; c < c1; ++c) {
    for (int j = 0; j < kc - 1; ++j) window[static_cast<size_t>(j)] = state[j * channels + c];
    const float* w = v.conv1d.data() + c * kc;
    for (int64_t r = 0; r < rows; ++r) {
      window[static_cast<size_t>(kc - 1)] = a.qkv.row<float>(r)[c];
      float acc = w[0] * window[0];
      for (int j = 1; j < kc; ++j) acc = acc + w[j] * window[static_cast<size_t>(j)];
      conv_out[r * channels + c] = silu(acc);
      std::rotate(window.begin(), window.begin() + 1, window.end());  // drop the oldest input
      if (!a.snapshots.empty()) {
        float* snap = a.snapshots.conv.row<float>(r);
        for (int j = 0; j < kc - 1; ++j) snap[j * channels + c] = window[static_cast<size_t>(j)];
      }
    }
    for (int j = 0; j < kc - 1; ++j) state[j * channels + c] = window[static_cast<size_t>(j)];
  }
}

}  // namespace

void gated_delta_net(const Exec& pool, const GatedDeltaNetArgs& a, const GdnVectors& v) {
  const GdnDims& d = a.dims;
  const int64_t rows = a.qkv.rows;
  const int64_t channels = a.qkv.cols;
  const int dk = d.k_head_dim;
  const int dv = d.v_head_dim;
  const int ratio = d.num_v_heads / d.num_k_heads;
  const int64_t key_dim = int64_t{d.num_k_heads} * dk;

  // Phase 1: conv over q|k|v, split by channel.
  std::vector<float> conv_out(static_cast<size_t>(rows * channels));
  parallel_for(pool, static_cast<size_t>(channels), static_cast<double>(rows * d.conv_kernel),
               [&](size_t begin, size_t end) {
                 conv_channels(a, v, static_cast<int64_t>(begin), static_cast<int64_t>(end), conv_out.data());
               });

  if (a.prefill) {
    gdn_chunked(pool, a, v, conv_out.data());
    return;
  }

  // Phase 2: the gated delta rule per value head, rows in order. Value head h reads key head h / ratio.
  const float q_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk)));
  const int64_t state_size = int64_t{dk} * dv;
  parallel_for(pool, static_cast<size_t>(d.num_v_heads), 4.0 * static_cast<double>(rows * dk * dv),
               [&](size_t begin, size_t end) {
                 std::vector<float> q(static_cast<size_t>(dk)), k(static_cast<size_t>(dk));
                 std::vector<float> kv(static_cast<size_t>(dv)), delta(static_cast<size_t>(dv)),
                     o(static_cast<size_t>(dv));
                 for (size_t hh = begin; hh < end; ++hh) {
                   const int h = static_cast<int>(hh);
                   const int kh = h / ratio;
                   float* s = a.state.recurrent.row<float>(h);  // [Dk, Dv]
                   const float neg_a = -std::exp(v.A_log[static_cast<size_t>(h)]);
                   for (int64_t r = 0; r < rows; ++r) {
                     const float* x = conv_out.data() + r * channels;
                     l2norm(x + int64_t{kh} * dk, dk, q_scale, q.data());
                     l2norm(x + key_dim + int64_t{kh} * dk, dk, 1.0f, k.data());
                     const float* val = x + 2 * key_dim + int64_t{h} * dv;
                     const float beta = sigmoid(a.b.row<float>(r)[h]);
                     const float g =
                         neg_a * softplus(a.a.row<float>(r)[h] + v.dt_bias[static_cast<size_t>(h)]);
                     const float alpha = std::exp(g);

                     // S *= alpha; kv = S^T k  (sums over the key dim in ascending order)
                     std::fill(kv.begin(), kv.end(), 0.0f);
                     for (int i = 0; i < dk; ++i)
                       decay_row(s + int64_t{i} * dv, alpha, k[static_cast<size_t>(i)], kv.data(), dv);
                     for (int j = 0; j < dv; ++j)
                       delta[static_cast<size_t>(j)] = (val[j] - kv[static_cast<size_t>(j)]) * beta;
                     // S += k delta^T; o = S^T q
                     std::fill(o.begin(), o.end(), 0.0f);
                     for (int i = 0; i < dk; ++i) {
                       update_row(s + int64_t{i} * dv, k[static_cast<size_t>(i)], delta.data(),
                                  q[static_cast<size_t>(i)], o.data(), dv);
                     }
                     if (!a.snapshots.empty()) {
                       std::copy(s, s + state_size, a.snapshots.recurrent.row<float>(r) + h * state_size);
                     }

                     gdn_gated_norm(o.data(), a.z.row<float>(r) + int64_t{h} * dv, v.norm.data(), dv, d.eps,
                                    a.out.row<float>(r) + int64_t{h} * dv);
                   }
                 }
               });
}

}  // namespace pd::cpu
