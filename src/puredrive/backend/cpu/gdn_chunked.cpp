// Gated DeltaNet prefill in the chunked (WY / UT-transform) form of spec §5.7, the math of
// flash-linear-attention's chunk_gated_delta_rule and transformers' torch_chunk_gated_delta_rule, over chunks
// of kGdnPrefillChunk positions aligned to absolute positions (backend.h GatedDeltaNetArgs). Per value head h
// and chunk of L rows, with q and k l2-normalised (q scaled by Dk^-1/2), beta = sigmoid(b), g the log decays
// and G their running sum inside the chunk:
//   N[i][j] = beta_i (k_i . k_j) e^(G_i - G_j) for j < i;  T = (I + N)^-1 - I (forward substitution)
//   U = (I + T) diag(beta) V;  W = (I + T) diag(beta e^G) K
//   v' = U - W S;  o_i = e^G_i q_i S + sum_{j <= i} (q_i . k_j) e^(G_i - G_j) v'_j
//   S <- e^G_last S + sum_j e^(G_last - G_j) k_j v'_j^T
// Every product is a fixed-order chain of fused multiply-adds (fma_product), so a chunk's results depend only
// on its own rows and the state before it: neither the rows around it in the step nor the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "puredrive/backend/cpu/cpu_ops.h"
#include "puredrive/backend/cpu/kernels.h"

namespace pd::cpu {
namespace {

constexpr int kChunk = kGdnPrefillChunk;

// e^x for a log decay x <= 0, or 0 below e^-50 (2e-22). Every sum of the chunked form has an undecayed term
// (the diagonal of the chunk, the last row's update), next to which such a term never shows in fp32; and
// decays that small would otherwise make subnormal operands, on which the FMA units take microcode assists
// (three times slower prefill for fast-forgetting heads such as the tiny coder's).
float decay_factor(float x) {
  return x < -50.0f ? 0.0f : std::exp(x);
}

// Inputs shared by every head: the normalised q and k of every row and key head, and the gates.
struct Prepared {
  std::vector<float> q, k;     // [R, Hk * Dk]
  std::vector<float> beta, g;  // [R, Hv]
};

Prepared prepare(const Exec& pool, const GatedDeltaNetArgs& a, const GdnVectors& v, const float* conv_out) {
  const GdnDims& d = a.dims;
  const int64_t rows = a.qkv.rows;
  const int64_t channels = a.qkv.cols;
  const int dk = d.k_head_dim;
  const int64_t key_dim = int64_t{d.num_k_heads} * dk;
  const float q_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk)));
  Prepared p;
  p.q.resize(static_cast<size_t>(rows * key_dim));
  p.k.resize(p.q.size());
  p.beta.resize(static_cast<size_t>(rows * d.num_v_heads));
  p.g.resize(p.beta.size());
  parallel_for(pool, static_cast<size_t>(rows), static_cast<double>(2 * key_dim),
               [&](size_t begin, size_t end) {
                 for (size_t rr = begin; rr < end; ++rr) {
                   const auto r = static_cast<int64_t>(rr);
                   const float* x = conv_out + r * channels;
                   for (int kh = 0; kh < d.num_k_heads; ++kh) {
                     const int64_t off = r * key_dim + int64_t{kh} * dk;
                     l2norm(x + int64_t{kh} * dk, dk, q_scale, p.q.data() + off);
                     l2norm(x + key_dim + int64_t{kh} * dk, dk, 1.0f, p.k.data() + off);
                   }
                   for (int h = 0; h < d.num_v_heads; ++h) {
                     const auto i = static_cast<size_t>(r * d.num_v_heads + h);
                     p.beta[i] = sigmoid(a.b.row<float>(r)[h]);
                     p.g[i] = -std::exp(v.A_log[static_cast<size_t>(h)]) *
                              softplus(a.a.row<float>(r)[h] + v.dt_bias[static_cast<size_t>(h)]);
                   }
                 }
               });
  return p;
}

// One thread's work space for a chunk of one head.
struct ChunkBuffers {
  explicit ChunkBuffers(int dk, int dv) {
    for (std::vector<float>* m : {&kt, &kdt}) m->resize(static_cast<size_t>(dk) * kChunk);
    for (std::vector<float>* m : {&n, &t, &p}) m->resize(static_cast<size_t>(kChunk) * kChunk);
    for (std::vector<float>* m : {&kbg, &w, &qg}) m->resize(static_cast<size_t>(kChunk) * dk);
    for (std::vector<float>* m : {&vb, &u, &vnew, &o1, &o2}) m->resize(static_cast<size_t>(kChunk) * dv);
    g.resize(kChunk);
  }
  std::vector<float> kt, kdt;      // K^T and the decayed K^T [Dk, 64]
  std::vector<float> n, t, p;      // [64, 64]: N, T, the decayed causal q.k
  std::vector<float> kbg, w, qg;   // [64, Dk]
  std::vector<float> vb, u, vnew;  // [64, Dv]
  std::vector<float> o1, o2;       // [64, Dv]: from the state, from the chunk
  std::vector<float> g;            // G: running sums of the log decays
};

// Rows [r0, r0 + L) of value head h: reads and updates the head's state s [Dk, Dv], writes the outputs.
void chunk(const GatedDeltaNetArgs& a, const GdnVectors& v, const Prepared& pre, const float* conv_out, int h,
           int64_t r0, int L, float* s, ChunkBuffers& b) {
  const GdnDims& d = a.dims;
  const int dk = d.k_head_dim, dv = d.v_head_dim, hv = d.num_v_heads;
  const int kh = h / (hv / d.num_k_heads);
  const int64_t key_dim = int64_t{d.num_k_heads} * dk;
  const int64_t channels = a.qkv.cols;
  const float* q = pre.q.data() + r0 * key_dim + int64_t{kh} * dk;  // row stride key_dim
  const float* k = pre.k.data() + r0 * key_dim + int64_t{kh} * dk;
  const float* val = conv_out + r0 * channels + 2 * key_dim + int64_t{h} * dv;  // row stride channels
  auto beta = [&](int i) { return pre.beta[static_cast<size_t>((r0 + i) * hv + h)]; };
  float* G = b.g.data();
  for (int i = 0; i < L; ++i) {
    const float gi = pre.g[static_cast<size_t>((r0 + i) * hv + h)];
    G[i] = i == 0 ? gi : G[i - 1] + gi;
  }
  for (int i = 0; i < L; ++i) {
    for (int c = 0; c < dk; ++c) b.kt[static_cast<size_t>(c * kChunk + i)] = k[i * key_dim + c];
  }
  const FmaOperand kt{b.kt.data(), kChunk};
  // N from k.k, and the decayed causal q.k (P) from q.k.
  fma_product(L, L, 0, dk, dk, {k, key_dim}, kt, b.n.data(), kChunk, false);  // j < i
  fma_product(L, L, 1, dk, dk, {q, key_dim}, kt, b.p.data(), kChunk, false);  // j <= i
  for (int i = 0; i < L; ++i) {
    float* ni = b.n.data() + i * kChunk;
    float* pi = b.p.data() + i * kChunk;
    for (int j = 0; j <= i; ++j) {
      const float decay = decay_factor(G[i] - G[j]);
      if (j < i) ni[j] = (beta(i) * ni[j]) * decay;
      pi[j] = pi[j] * decay;
    }
  }
  // T = (I + N)^-1 - I, strictly lower: T[i][j] = -(N[i][j] + sum_m N[i][m] T[m][j]), rows in order.
  std::fill(b.t.begin(), b.t.end(), 0.0f);
  for (int i = 1; i < L; ++i) {
    float* ti = b.t.data() + i * kChunk;
    std::copy(b.n.data() + i * kChunk, b.n.data() + i * kChunk + i, ti);
    fma_product(1, i, i, i, i, {b.n.data() + i * kChunk, kChunk}, {b.t.data(), kChunk}, ti, kChunk, true);
    for (int j = 0; j < i; ++j) ti[j] = -ti[j];
  }
  // U = (I + T) diag(beta) V and W = (I + T) diag(beta e^G) K.
  for (int i = 0; i < L; ++i) {
    const float bi = beta(i), eg = decay_factor(G[i]), bg = bi * eg;
    for (int c = 0; c < dv; ++c) b.vb[static_cast<size_t>(i * dv + c)] = val[i * channels + c] * bi;
    for (int c = 0; c < dk; ++c) {
      b.kbg[static_cast<size_t>(i * dk + c)] = k[i * key_dim + c] * bg;
      b.qg[static_cast<size_t>(i * dk + c)] = q[i * key_dim + c] * eg;
    }
  }
  std::copy(b.vb.begin(), b.vb.begin() + L * dv, b.u.begin());
  std::copy(b.kbg.begin(), b.kbg.begin() + L * dk, b.w.begin());
  fma_product(L, dv, dv, L, 0, {b.t.data(), kChunk}, {b.vb.data(), dv}, b.u.data(), dv, true);
  fma_product(L, dk, dk, L, 0, {b.t.data(), kChunk}, {b.kbg.data(), dk}, b.w.data(), dk, true);

  // v' = U - W S; o = (q e^G) S + P v'.
  const FmaOperand state{s, dv};
  fma_product(L, dv, dv, dk, dk, {b.w.data(), dk}, state, b.vnew.data(), dv, false);
  for (int i = 0; i < L * dv; ++i)
    b.vnew[static_cast<size_t>(i)] = b.u[static_cast<size_t>(i)] - b.vnew[static_cast<size_t>(i)];
  fma_product(L, dv, dv, dk, dk, {b.qg.data(), dk}, state, b.o1.data(), dv, false);
  fma_product(L, dv, dv, L, 1, {b.p.data(), kChunk}, {b.vnew.data(), dv}, b.o2.data(), dv, false);
  for (int i = 0; i < L; ++i) {
    const int64_t r = r0 + i;
    float* o = b.o1.data() + i * dv;
    for (int c = 0; c < dv; ++c) o[c] = o[c] + b.o2[static_cast<size_t>(i * dv + c)];
    gdn_gated_norm(o, a.z.row<float>(r) + int64_t{h} * dv, v.norm.data(), dv, d.eps,
                   a.out.row<float>(r) + int64_t{h} * dv);
  }

  // S <- e^G_last S + (K e^(G_last - G))^T v'.
  const float g_last = G[L - 1];
  for (int i = 0; i < L; ++i) {
    const float e = decay_factor(g_last - G[i]);
    for (int c = 0; c < dk; ++c) b.kdt[static_cast<size_t>(c * kChunk + i)] = k[i * key_dim + c] * e;
  }
  const float e_last = decay_factor(g_last);
  for (int64_t i = 0; i < int64_t{dk} * dv; ++i) s[i] = s[i] * e_last;
  fma_product(dk, dv, dv, L, L, {b.kdt.data(), kChunk}, {b.vnew.data(), dv}, s, dv, true);
}

}  // namespace

void gdn_chunked(const Exec& pool, const GatedDeltaNetArgs& a, const GdnVectors& v, const float* conv_out) {
  const GdnDims& d = a.dims;
  const int64_t rows = a.qkv.rows;
  const Prepared pre = prepare(pool, a, v, conv_out);
  // Chunk boundaries sit where the absolute position is a multiple of kChunk.
  const int first = kChunk - a.position % kChunk;
  const double work = 3.0 * static_cast<double>(rows) * d.k_head_dim * d.v_head_dim;
  parallel_for(pool, static_cast<size_t>(d.num_v_heads), work, [&](size_t begin, size_t end) {
    ChunkBuffers buf(d.k_head_dim, d.v_head_dim);
    for (size_t h = begin; h < end; ++h) {
      float* s = a.state.recurrent.row<float>(static_cast<int64_t>(h));
      for (int64_t r0 = 0; r0 < rows;) {
        const int L = static_cast<int>(std::min<int64_t>(rows - r0, r0 == 0 ? first : kChunk));
        chunk(a, v, pre, conv_out, static_cast<int>(h), r0, L, s, buf);
        r0 += L;
      }
    }
  });
}

}  // namespace pd::cpu
