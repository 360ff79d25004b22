// Split-K GQA decode / verify attention on the tensor cores (bf16 KV cache, up to kMaxRows rows).
//
// Work item = (split c of split size S, KV head kh): the keys [c S, (c + 1) S) of one KV head are read once,
// 64 at a time, for every query head of the group and every row of the step whose split plan
// (attention_plan.h) has that split; rows whose positions give another S form another class of items. Per
// 64-key tile: scores S^T = K . Q^T (M = keys, N = queries: a one-row step of a group of 8 fills an mma
// exactly), the tile's online-softmax update per query, then O^T += V^T . P^T. Queries and probabilities
// enter the bf16 mma as hi + lo pairs (split_bf16), so scores and weights keep about 16 bits instead of 8.
// The item's unnormalised output, max and sum are written as a partial; attention.cu merges the partials in
// ascending split order and applies the gate.
//
// Row-exactness (docs/DESIGN.md §4.1): a query's arithmetic depends only on its row's position: the splits
// are fixed by it, the tiles of a split are visited in order, each score and output element is an mma
// element with a fixed k order, and the softmax reductions are per query in a fixed order. A tile past a
// row's position is skipped for that row (its state is kept, not multiplied by one); keys past the position
// inside its last tile get probability exactly zero, whatever the cache holds there (other rows' new keys, or
// zero fill).
#include "puredrive/backend/cuda/attention_mma.cuh"
#include "puredrive/backend/cuda/trace.cuh"

namespace pd::cuda {
namespace {

using attn::kPad;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kScStride = kAttnTile + 4;  // f32 scores per query row (bank-conflict-free stores)
constexpr int kPStride = kAttnTile + 8;   // bf16 probabilities per query row

// The rows of a launch grouped by split size: class j holds the rows (bit mask) whose S(p) is split[j], and
// its items are first[j] .. first[j + 1] - 1, split-major.
struct Plan {
  int pos[kMaxRows];  // -1: not a valid position (no output from this kernel)
  int split[kMaxRows];
  unsigned rows[kMaxRows];
  int first[kMaxRows + 1];
  int classes;
};

// Shared memory of a block for head dim D and nq (a multiple of 8) query columns, all of it dynamic (the
// opt-in limit then applies to the whole); every part 16-byte aligned.
struct Layout {
  size_t k, v, qhi, qlo, sc, phi, plo, m, l, alpha, plan, bytes;
};
__host__ __device__ inline Layout layout(int D, int nq) {
  Layout o{};
  const size_t tile = static_cast<size_t>(kAttnTile) * (D + kPad) * 2;
  const size_t q = static_cast<size_t>(nq) * (D + kPad) * 2;
  o.k = 0;
  o.v = o.k + tile;
  o.qhi = o.v + tile;
  o.qlo = o.qhi + q;
  o.sc = o.qlo + q;
  o.phi = o.sc + 2 * static_cast<size_t>(nq) * kScStride * 4;  // two halves of the dims
  o.plo = o.phi + static_cast<size_t>(nq) * kPStride * 2;
  o.m = o.plo + static_cast<size_t>(nq) * kPStride * 2;
  o.l = o.m + static_cast<size_t>(nq) * 4;
  o.alpha = o.l + static_cast<size_t>(nq) * 4;
  o.plan = o.alpha + static_cast<size_t>(nq) * 4;
  o.bytes = o.plan + (sizeof(Plan) + 15) / 16 * 16;
  return o;
}

__device__ void make_plan(const AttentionLaunch& a, int r0, int nrows, Plan* p) {
  int32_t at[kMaxRows];  // every row's position in flight at once (a loop of loads took one trip each)
#pragma unroll
  for (int r = 0; r < kMaxRows; ++r) {
    at[r] = r < nrows ? a.positions[static_cast<int64_t>(r0 + r) * a.position_stride] : -1;
  }
  int n = 0;
  int most[kMaxRows];
#pragma unroll
  for (int r = 0; r < kMaxRows; ++r) {
    if (r >= nrows) break;
    const int32_t pos = at[r];
    const bool valid = pos >= 0 && pos < a.capacity;
    p->pos[r] = valid ? pos : -1;
    if (!valid) continue;
    const int s = attn_split_size(pos, a.num_kv_heads);
    int j = 0;
    while (j < n && p->split[j] != s) ++j;
    if (j == n) {
      p->split[j] = s;
      p->rows[j] = 0;
      most[j] = 0;
      ++n;
    }
    p->rows[j] |= 1u << r;
    const int ns = attn_num_splits(pos, a.num_kv_heads);
    most[j] = ns > most[j] ? ns : most[j];
  }
  p->first[0] = 0;
  for (int j = 0; j < n; ++j) p->first[j + 1] = p->first[j] + most[j] * a.num_kv_heads;
  p->classes = n;
}

// Partial scores of the tile, in two halves of the head dims: sc[h][q][t] = k_t . q_hi + k_t . q_lo over the
// 16-dim steps h, h + 2, h + 4, ...; the score is (sc[0] + sc[1]) * scale. Warp (key block mi of 16, half h)
// loads each K fragment once for up to kScoreBlocks query blocks of 8, whose hi and lo products accumulate
// in separate chains; every element's chain is the same whatever the number of query blocks.
constexpr int kScoreBlocks = 4;
// Query blocks a warp works on at once: the largest divisor of NT up to kScoreBlocks (NT is 1-4, 6, 8, 12,
// 16).
constexpr int inner_blocks(int nt) {
  return nt <= kScoreBlocks ? nt : nt % 4 == 0 ? 4 : nt % 3 == 0 ? 3 : 2;
}
template <int NT>
__device__ __forceinline__ void tile_scores(const uint16_t* ks, const uint16_t* qhi, const uint16_t* qlo,
                                            float* sc, int D) {
  static_assert(kWarps == 8, "one warp per (key block, half)");
  constexpr int NB = inner_blocks(NT), kNq = NT * 8;
  static_assert(NT % NB == 0 && NB <= kScoreBlocks);
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int g = lane >> 2, t = lane & 3, ld = D + kPad;
  const int mi = warp & 3, h = warp >> 2;
  // A = K (keys x dims): matrix i of the ldmatrix is keys +8 (i & 1), dims +8 (i >> 1).
  const uint16_t* ka = ks + (mi * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * ld + 8 * (lane >> 4);
  float* out = sc + h * kNq * kScStride;
#pragma unroll 1
  for (int n0 = 0; n0 < NT; n0 += NB) {
    float hi[NB][4], lo[NB][4];
#pragma unroll
    for (int b = 0; b < NB; ++b) {
#pragma unroll
      for (int e = 0; e < 4; ++e) hi[b][e] = lo[b][e] = 0.0f;
    }
    for (int k0 = 16 * h; k0 < D; k0 += 32) {
      uint32_t a[4];
      ldmatrix_x4(a, ka + k0);
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const uint16_t* qh = qhi + ((n0 + b) * 8 + g) * ld + 2 * t + k0;
        const uint16_t* ql = qlo + ((n0 + b) * 8 + g) * ld + 2 * t + k0;
        attn::mma_bf16(hi[b], a, attn::ld_pair(qh), attn::ld_pair(qh + 8));
        attn::mma_bf16(lo[b], a, attn::ld_pair(ql), attn::ld_pair(ql + 8));
      }
    }
    const int key = mi * 16 + g;
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const int q = (n0 + b) * 8 + 2 * t;
      out[q * kScStride + key] = hi[b][0] + lo[b][0];
      out[(q + 1) * kScStride + key] = hi[b][1] + lo[b][1];
      out[q * kScStride + key + 8] = hi[b][2] + lo[b][2];
      out[(q + 1) * kScStride + key + 8] = hi[b][3] + lo[b][3];
    }
  }
}

// Online-softmax update of the tile at keys [t0, t0 + 64), one warp per query: new max, probabilities (hi /
// lo bf16 for the mma), sum, and the factor alpha that rescales the query's output; alpha = -1 marks a query
// that this tile does not touch (padding, a row outside the item, or a tile past the row's position). Warp
// w has queries w, w + 8, ...; it takes them inner_blocks(NT) at a time, their shuffle reductions
// interleaved (a verify step's queries otherwise ran one dependent chain after another). Each query's
// arithmetic is the same whichever queries share its pass.
template <int NT>
__device__ __forceinline__ void tile_softmax(const float* sc, uint16_t* phi, uint16_t* plo, float* ms,
                                             float* ls, float* alphas, int q0, int nq, int group,
                                             const Plan& plan, unsigned active, int t0, float scale) {
  constexpr int NB = inner_blocks(NT), kNq = NT * 8;
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const float* sc1 = sc + kNq * kScStride;  // the second half of the dims (tile_scores)
#pragma unroll 1
  for (int j0 = 0; j0 < NT; j0 += NB) {
    int q[NB];
    bool on[NB], v0[NB], v1[NB];
    float s0[NB], s1[NB], mt[NB];
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      q[b] = warp + kWarps * (j0 + b);
      const int gq = q0 + q[b];
      const int r = gq < nq ? gq / group : 0;
      const int pos = plan.pos[r];
      on[b] = gq < nq && ((active >> r) & 1u) != 0 && t0 <= pos;
      s0[b] = (sc[q[b] * kScStride + lane] + sc1[q[b] * kScStride + lane]) * scale;
      s1[b] = (sc[q[b] * kScStride + lane + 32] + sc1[q[b] * kScStride + lane + 32]) * scale;
      v0[b] = on[b] && t0 + lane <= pos;
      v1[b] = on[b] && t0 + lane + 32 <= pos;
      mt[b] = fmaxf(v0[b] ? s0[b] : -INFINITY, v1[b] ? s1[b] : -INFINITY);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
      for (int b = 0; b < NB; ++b) mt[b] = fmaxf(mt[b], __shfl_xor_sync(0xffffffffu, mt[b], off));
    }
    float m_old[NB], m_new[NB], p0[NB], p1[NB], sum[NB];
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      m_old[b] = ms[q[b]];
      m_new[b] = fmaxf(m_old[b], mt[b]);  // finite when on: key t0 <= pos is valid
      p0[b] = v0[b] ? expf(s0[b] - m_new[b]) : 0.0f;
      p1[b] = v1[b] ? expf(s1[b] - m_new[b]) : 0.0f;
      sum[b] = p0[b] + p1[b];
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
      for (int b = 0; b < NB; ++b) sum[b] += __shfl_xor_sync(0xffffffffu, sum[b], off);
    }
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      uint16_t* ph = phi + q[b] * kPStride;
      uint16_t* pl = plo + q[b] * kPStride;
      if (!on[b]) {
        ph[lane] = 0;
        ph[lane + 32] = 0;
        pl[lane] = 0;
        pl[lane + 32] = 0;
        if (lane == 0) alphas[q[b]] = -1.0f;
        continue;
      }
      attn::split_bf16(p0[b], &ph[lane], &pl[lane]);
      attn::split_bf16(p1[b], &ph[lane + 32], &pl[lane + 32]);
      if (lane == 0) {
        const float alpha = expf(m_old[b] - m_new[b]);  // 0 on the item's first tile (m_old = -inf)
        ms[q[b]] = m_new[b];
        ls[q[b]] = ls[q[b]] * alpha + sum[b];
        alphas[q[b]] = alpha;
      }
    }
  }
}

// o^T (dims x queries) = o^T * alpha + V^T . P^T over the tile's 64 keys. Warp w owns dims blocks w and w + 8
// (16 dims each) for every query block; a query block's probability fragments are loaded once for both.
template <int NT>
__device__ __forceinline__ void tile_values(float acc[2][NT][4], const uint16_t* vs, const uint16_t* phi,
                                            const uint16_t* plo, const float* alphas, int D) {
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int g = lane >> 2, t = lane & 3, ld = D + kPad;
  if (warp * 16 >= D) return;  // uniform over the warp: no dims of its own (D < 128)
  const bool second = (warp + kWarps) * 16 < D;
  // A = V^T (dims x keys) from V (keys x dims) with .trans: matrix i is dims +8 (i & 1), keys +8 (i >> 1).
  uint32_t a[2][4][4];
#pragma unroll
  for (int mm = 0; mm < 2; ++mm) {
    const uint16_t* va =
        vs + ((lane & 7) + 8 * (lane >> 4)) * ld + (warp + mm * kWarps) * 16 + 8 * ((lane >> 3) & 1);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      if (mm == 0 || second) ldmatrix_x4_trans(a[mm][kk], va + kk * 16 * ld);
    }
  }
#pragma unroll
  for (int ni = 0; ni < NT; ++ni) {
    const int q0 = ni * 8 + 2 * t;
    const float a0 = alphas[q0], a1 = alphas[q0 + 1];
    const uint16_t* ph = phi + (ni * 8 + g) * kPStride + 2 * t;
    const uint16_t* pl = plo + (ni * 8 + g) * kPStride + 2 * t;
    uint32_t bh[4][2], bl[4][2];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      bh[kk][0] = attn::ld_pair(ph + kk * 16);
      bh[kk][1] = attn::ld_pair(ph + kk * 16 + 8);
      bl[kk][0] = attn::ld_pair(pl + kk * 16);
      bl[kk][1] = attn::ld_pair(pl + kk * 16 + 8);
    }
#pragma unroll
    for (int mm = 0; mm < 2; ++mm) {
      if (mm == 1 && !second) continue;
      float* c = acc[mm][ni];
      float d[4] = {c[0] * a0, c[1] * a1, c[2] * a0, c[3] * a1};
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        attn::mma_bf16(d, a[mm][kk], bh[kk][0], bh[kk][1]);
        attn::mma_bf16(d, a[mm][kk], bl[kk][0], bl[kk][1]);
      }
      if (a0 >= 0.0f) {
        c[0] = d[0];
        c[2] = d[2];
      }
      if (a1 >= 0.0f) {
        c[1] = d[1];
        c[3] = d[3];
      }
    }
  }
}

// Queries q0 .. q0 + kNq - 1 of KV head kh's group (zero from nq on) as hi / lo bf16 rows of ld = D + kPad:
// 16-byte loads, kBatch of them in flight per thread before any is split (one load at a time, with a
// division per element, took a third of a 3-row launch).
template <int NT>
__device__ __forceinline__ void load_queries(const float* qbuf, uint16_t* qhi, uint16_t* qlo, int kh, int hq,
                                             int group, int q0, int nq, int D) {
  constexpr int kNq = NT * 8, kBatch = 2 * NT < 8 ? 2 * NT : 8;
  const int ld = D + kPad, n4 = kNq * D / 4;
  for (int base = 0; base < n4; base += kBatch * kThreads) {
    float4 x[kBatch];
    int q[kBatch], d[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int i = base + k * kThreads + static_cast<int>(threadIdx.x);
      q[k] = i < n4 ? 4 * i / D : kNq;
      d[k] = 4 * i - q[k] * D;
      x[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const int gq = q0 + q[k];
      if (q[k] < kNq && gq < nq) {
        const int r = gq / group;
        x[k] = *reinterpret_cast<const float4*>(
            qbuf + (static_cast<int64_t>(r) * hq + kh * group + (gq - r * group)) * D + d[k]);
      }
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      if (q[k] >= kNq) continue;
      uint16_t* hi = qhi + q[k] * ld + d[k];
      uint16_t* lo = qlo + q[k] * ld + d[k];
      attn::split_bf16(x[k].x, hi, lo);
      attn::split_bf16(x[k].y, hi + 1, lo + 1);
      attn::split_bf16(x[k].z, hi + 2, lo + 2);
      attn::split_bf16(x[k].w, hi + 3, lo + 3);
    }
  }
}

// A block's shared memory for NT query blocks.
struct Smem {
  uint16_t *ks, *vs, *qhi, *qlo, *phi, *plo;
  float *sc, *ms, *ls, *alphas;
  __device__ Smem(unsigned char* smem, int D, int nq) {
    const Layout L = layout(D, nq);
    ks = reinterpret_cast<uint16_t*>(smem + L.k);
    vs = reinterpret_cast<uint16_t*>(smem + L.v);
    qhi = reinterpret_cast<uint16_t*>(smem + L.qhi);
    qlo = reinterpret_cast<uint16_t*>(smem + L.qlo);
    sc = reinterpret_cast<float*>(smem + L.sc);
    phi = reinterpret_cast<uint16_t*>(smem + L.phi);
    plo = reinterpret_cast<uint16_t*>(smem + L.plo);
    ms = reinterpret_cast<float*>(smem + L.m);
    ls = reinterpret_cast<float*>(smem + L.l);
    alphas = reinterpret_cast<float*>(smem + L.alpha);
  }
};

// Work item `item` of the plan for the queries q0 .. q0 + 8 NT - 1 of the launch (query q is head q % group
// of row q / group) and the rows in `rows`: the partial results of its split. `loaded` names the queries in
// qhi / qlo (q0 and the KV head), so that consecutive items of a block load them once.
template <int NT>
__device__ __forceinline__ void run_item(const AttentionLaunch& a, const Plan& plan, const Smem& m, int item,
                                         int q0, unsigned rows, int nrows, const float* qbuf, float* part_o,
                                         float* part_ml, int max_splits, int* loaded) {
  constexpr int kNq = NT * 8;
  const int D = a.head_dim, hkv = a.num_kv_heads, hq = a.num_heads;
  const int group = hq / hkv, nq = nrows * group;
  const uint16_t* kc = static_cast<const uint16_t*>(a.cache_k);
  const uint16_t* vc = static_cast<const uint16_t*>(a.cache_v);
  const int64_t kvw = static_cast<int64_t>(hkv) * D;
  const float scale = static_cast<float>(1.0 / sqrt(static_cast<double>(D)));
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  const int g = lane >> 2, t = lane & 3;
  int j = 0;
  while (item >= plan.first[j + 1]) ++j;
  const int local = item - plan.first[j];
  const int c = local / hkv, kh = local - c * hkv;
  const int S = plan.split[j], start = c * S;
  unsigned active = 0;
  int end = start;
  for (int r = 0; r < nrows; ++r) {
    if (((plan.rows[j] & rows) >> r & 1u) != 0 && plan.pos[r] >= start) {
      active |= 1u << r;
      const int e = plan.pos[r] + 1 < start + S ? plan.pos[r] + 1 : start + S;
      end = e > end ? e : end;
    }
  }
  if (active == 0) return;  // uniform over the block: none of these rows reaches this split
  // Keys and values of a tile load while the previous phase computes: K(i+1) during softmax and values of
  // tile i, V(i+1) during the scores of tile i+1; the first tile's during the queries' loads.
  const int tiles = (end - start + kAttnTile - 1) / kAttnTile;
  attn::issue_kv_tile(m.ks, kc, kvw, kh, D, start, end);
  copy_async_commit();
  attn::issue_kv_tile(m.vs, vc, kvw, kh, D, start, end);
  copy_async_commit();
  if (*loaded != q0 * hkv + kh) {
    load_queries<NT>(qbuf, m.qhi, m.qlo, kh, hq, group, q0, nq, D);
    *loaded = q0 * hkv + kh;
  }
  for (int q = static_cast<int>(threadIdx.x); q < kNq; q += kThreads) {
    m.ms[q] = -INFINITY;
    m.ls[q] = 0.0f;
  }
  float acc[2][NT][4];
#pragma unroll
  for (int mm = 0; mm < 2; ++mm) {
#pragma unroll
    for (int ni = 0; ni < NT; ++ni) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mm][ni][e] = 0.0f;
    }
  }
  for (int it = 0; it < tiles; ++it) {
    const int t0 = start + it * kAttnTile;
    copy_async_wait<1>();  // K(it)
    __syncthreads();
    tile_scores<NT>(m.ks, m.qhi, m.qlo, m.sc, D);
    __syncthreads();
    if (it + 1 < tiles) attn::issue_kv_tile(m.ks, kc, kvw, kh, D, t0 + kAttnTile, end);
    copy_async_commit();
    tile_softmax<NT>(m.sc, m.phi, m.plo, m.ms, m.ls, m.alphas, q0, nq, group, plan, active, t0, scale);
    copy_async_wait<1>();  // V(it)
    __syncthreads();
    tile_values<NT>(acc, m.vs, m.phi, m.plo, m.alphas, D);
    __syncthreads();
    if (it + 1 < tiles) attn::issue_kv_tile(m.vs, vc, kvw, kh, D, t0 + kAttnTile, end);
    copy_async_commit();
  }
  // Partial results of the item's active rows: output (unnormalised), max and sum. A lane's outputs belong to
  // 2 NT queries; each query's row and address are worked out once (a division by the run-time group per
  // output element was most of the kernel's code, and its code runs cold once per launch).
#pragma unroll
  for (int ni = 0; ni < NT; ++ni) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int q = q0 + ni * 8 + 2 * t + h;
      if (q >= nq) continue;
      const int r = q / group;
      if (((active >> r) & 1u) == 0) continue;
      float* out =
          part_o + ((static_cast<int64_t>(r) * hq + kh * group + (q - r * group)) * max_splits + c) * D;
#pragma unroll
      for (int mm = 0; mm < 2; ++mm) {
        const int mt = warp + mm * kWarps;
        if (mt * 16 >= D) continue;
        out[mt * 16 + g] = acc[mm][ni][h];
        out[mt * 16 + g + 8] = acc[mm][ni][h + 2];
      }
    }
  }
  for (int ql = static_cast<int>(threadIdx.x); ql < kNq; ql += kThreads) {
    const int q = q0 + ql;
    if (q >= nq) continue;
    const int r = q / group;
    if (((active >> r) & 1u) == 0) continue;
    const int64_t at = (static_cast<int64_t>(r) * hq + kh * group + (q - r * group)) * max_splits + c;
    part_ml[at * 2] = m.ms[ql];
    part_ml[at * 2 + 1] = m.ls[ql];
  }
  __syncthreads();  // the shared buffers are reused by the next item
}

// Two blocks per multiprocessor up to 3 query blocks (registers capped at 128; the 3-block kernel otherwise
// spilled), one above, where the shared memory of a 256-dim head allows no second block anyway.
//
// When every row is one query block (a GQA group of 8) and the items of all rows fit the grid one row at a
// time (short contexts: a 2K-token row has 66 items for 264 blocks), a block takes one (item, row) pair
// instead of one item for all rows: the rows' items run side by side rather than one query block after
// another in each block. Every query's arithmetic is the same either way (its scores, softmax and values
// never see another query), so the choice, which depends on the positions, changes no result. Long
// contexts keep one item for all rows: each KV tile is then read once for every row.
template <int NT>
__global__ void __launch_bounds__(kThreads, NT <= 3 ? 2 : 1)
    attn_decode_kernel(AttentionLaunch a, int r0, int nrows, const float* qbuf, float* part_o, float* part_ml,
                       int max_splits, bool row_items) {
  PD_TRACE_SCOPE(kAttnDecode, nrows);
  pdl_enter();
  PD_TRACE_STAMP(0);
  extern __shared__ __align__(16) unsigned char smem[];
  const int D = a.head_dim, group = a.num_heads / a.num_kv_heads;
  Plan& plan = *reinterpret_cast<Plan*>(smem + layout(D, NT * 8).plan);
  if (threadIdx.x == 0) make_plan(a, r0, nrows, &plan);
  __syncthreads();
  const int items = plan.first[plan.classes];
  const int grid = static_cast<int>(gridDim.x);
  int loaded = -1;
  if (NT > 1 && row_items && group == 8 && items * nrows <= grid) {
    const Smem m(smem, D, 8);
    for (int u = static_cast<int>(blockIdx.x); u < items * nrows; u += grid) {
      const int r = u / items;
      run_item<1>(a, plan, m, u - r * items, r * group, 1u << r, nrows, qbuf, part_o, part_ml, max_splits,
                  &loaded);
    }
    return;
  }
  const Smem m(smem, D, NT * 8);
  for (int item = static_cast<int>(blockIdx.x); item < items; item += grid) {
    run_item<NT>(a, plan, m, item, 0, ~0u, nrows, qbuf, part_o, part_ml, max_splits, &loaded);
  }
}

// Query columns of a launch, rounded up to a compiled width (8 per mma column block).
int query_blocks(int queries) {
  const int nt = (queries + 7) / 8;
  for (int c : {1, 2, 3, 4, 6, 8, 12, 16}) {
    if (nt <= c) return c;
  }
  return 0;
}

template <typename F>
void with_query_blocks(int nt, F&& f) {
  with_one_of<1, 2, 3, 4, 6, 8, 12, 16>(nt, f);
}

}  // namespace

bool attn_decode_supported(const AttentionLaunch& a) {
  return a.cache_bf16 && a.head_dim % 16 == 0 && a.head_dim <= 16 * 2 * kWarps &&
         attn_decode_rows_per_launch(a) > 0;
}

int attn_decode_rows_per_launch(const AttentionLaunch& a) {
  const int group = a.num_heads / a.num_kv_heads;
  for (int rows = kMaxRows; rows > 0; --rows) {
    const int nt = query_blocks(rows * group);
    if (nt > 0 && layout(a.head_dim, nt * 8).bytes <= a.smem_limit) return rows;
  }
  return 0;
}

void launch_attn_decode(const AttentionLaunch& a, int r0, int rows, const float* qbuf, float* part_o,
                        float* part_ml, cudaStream_t stream) {
  const int nt = query_blocks(rows * (a.num_heads / a.num_kv_heads));
  const size_t smem = layout(a.head_dim, nt * 8).bytes;
  // Two blocks per multiprocessor: enough items in flight to stream the cache at long contexts; blocks take
  // items in strides, so the grid never depends on the positions (one graph serves every step of width R).
  const unsigned grid = static_cast<unsigned>(2 * (a.multiprocessors > 0 ? a.multiprocessors : 1));
  static const bool row_items = env_switch_on("PD_ATTN_ROW_ITEMS");
  with_query_blocks(nt, [&](auto k) {
    PD_TRACE_ENSURE();
    launch_pdl(attn_decode_kernel<decltype(k)::value>, dim3(grid), dim3(kThreads), smem, stream, a, r0, rows,
               qbuf, part_o, part_ml, attn_max_splits(a.num_kv_heads), row_items);
  });
}

void set_attn_decode_smem_limit(size_t bytes) {
  for (int nt : {1, 2, 3, 4, 6, 8, 12, 16}) {
    with_query_blocks(nt, [&](auto k) {
      cudaFuncSetAttribute(attn_decode_kernel<decltype(k)::value>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    });
  }
}

}  // namespace pd::cuda
