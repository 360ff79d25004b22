// Causal flash attention for prefill steps (more than kMaxRows rows, bf16 KV cache) on the tensor cores.
//
// Block = (query head h, query tile): the step's rows whose positions fall in one 64-aligned block of
// absolute positions [64 i, 64 i + 64) (the first and last tiles of a step may be partial), 16 rows per warp.
// Key tiles are the 64-aligned blocks [0, 64), [64, 128), ... up to the tile's last position, visited in
// ascending order; per key tile: S = Q . K^T, the online-softmax update of each row (max, exp2, sum in a
// fixed order), O = O * alpha + P . V, with Q and P rounded to bf16 (the usual flash-attention precision;
// decode keeps about 16 bits, see attention_decode.cu); at the end out = (O / l) * sigmoid(gate). Keys and
// values of the next tile load while the current one computes.
//
// Chunking invariance (docs/DESIGN.md §4.6): a row's result depends only on its position and the cache, not
// on how the prompt was cut into steps, as long as the steps start on multiples of 64: its query tile then
// holds the same rows in every cut, its key tiles are fixed by absolute position, and every reduction is per
// row in a fixed order (an mma element depends only on its own row). Steps of at most kMaxRows rows take the
// decode kernels instead, whose results differ in the last bits.
#include "puredrive/backend/cuda/attention_mma.cuh"

namespace pd::cuda {
namespace {

using attn::kPad;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 16 * kWarps;  // rows per query tile: one 64-aligned block of positions
static_assert(kRows == kAttnTile, "query tiles and key tiles share the 64-position alignment");

template <int D>
constexpr size_t smem_bytes() {
  return 3 * static_cast<size_t>(kAttnTile) * (D + kPad) * 2 + kRows * sizeof(int);
}

template <int D>
__global__ void __launch_bounds__(kThreads) attn_prefill_kernel(AttentionLaunch a, const float* qbuf) {
  pdl_enter();
  constexpr int kLd = D + kPad, kDimBlocks = D / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* qs = reinterpret_cast<uint16_t*>(smem);
  uint16_t* ks = qs + kRows * kLd;
  uint16_t* vs = ks + kAttnTile * kLd;
  int* spos = reinterpret_cast<int*>(vs + kAttnTile * kLd);
  const int h = static_cast<int>(blockIdx.x), qt = static_cast<int>(blockIdx.y);
  const int hq = a.num_heads, kh = h / (hq / a.num_kv_heads);
  const attn::QueryTile tile = attn::query_tile(a, qt);
  if (tile.nr <= 0) return;
  const int rb = tile.rb, nr = tile.nr;
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  attn::tile_positions(a, tile, tid, spos);
  for (int i = tid; i < kRows * kDimBlocks; i += kThreads) {
    const int r = i / kDimBlocks, ch = i - r * kDimBlocks;
    uint4 packed = make_uint4(0, 0, 0, 0);
    if (r < nr) {
      const float4* src =
          reinterpret_cast<const float4*>(qbuf + (static_cast<int64_t>(rb + r) * hq + h) * D + ch * 8);
      const float4 x = src[0], y = src[1];
      packed = make_uint4(attn::pack_bf16(x.x, x.y), attn::pack_bf16(x.z, x.w), attn::pack_bf16(y.x, y.y),
                          attn::pack_bf16(y.z, y.w));
    }
    *reinterpret_cast<uint4*>(qs + r * kLd + ch * 8) = packed;
  }
  __syncthreads();
  int max_pos = -1;
  for (int r = 0; r < kRows; ++r) max_pos = spos[r] > max_pos ? spos[r] : max_pos;
  const int tiles = max_pos < 0 ? 0 : max_pos / kAttnTile + 1;
  const uint16_t* kc = static_cast<const uint16_t*>(a.cache_k);
  const uint16_t* vc = static_cast<const uint16_t*>(a.cache_v);
  const int64_t kvw = static_cast<int64_t>(a.num_kv_heads) * D;
  if (tiles > 0) {
    attn::issue_kv_tile(ks, kc, kvw, kh, D, 0, max_pos + 1);
    copy_async_commit();
    attn::issue_kv_tile(vs, vc, kvw, kh, D, 0, max_pos + 1);
    copy_async_commit();
  }
  const int pos0 = spos[warp * 16 + g], pos1 = spos[warp * 16 + g + 8];
  // Scores stay in raw units; exp2 of (s - m) * scale * log2(e).
  const float sl2 = static_cast<float>(1.4426950408889634 / sqrt(static_cast<double>(D)));
  float o[kDimBlocks][4];
#pragma unroll
  for (int n = 0; n < kDimBlocks; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  const uint16_t* qa_row = qs + (warp * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * kLd + 8 * (lane >> 4);
  const uint16_t* kb_row = ks + (8 * (lane >> 4) + (lane & 7)) * kLd + 8 * ((lane >> 3) & 1);
  const uint16_t* vb_row = vs + ((lane & 7) + 8 * ((lane >> 3) & 1)) * kLd + 8 * (lane >> 4);
  for (int kt = 0; kt < tiles; ++kt) {
    const int k0 = kt * kAttnTile;
    copy_async_wait<1>();  // K(kt)
    __syncthreads();
    float s[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int d0 = 0; d0 < D; d0 += 16) {
      uint32_t qa[4];
      ldmatrix_x4(qa, qa_row + d0);
#pragma unroll
      for (int nb = 0; nb < 8; nb += 2) {
        // B = K^T: matrix i of the ldmatrix is keys +8 (i >> 1), dims +8 (i & 1).
        uint32_t kb[4];
        ldmatrix_x4(kb, kb_row + nb * 8 * kLd + d0);
        attn::mma_bf16(s[nb], qa, kb[0], kb[1]);
        attn::mma_bf16(s[nb + 1], qa, kb[2], kb[3]);
      }
    }
    __syncthreads();
    if (kt + 1 < tiles) attn::issue_kv_tile(ks, kc, kvw, kh, D, k0 + kAttnTile, max_pos + 1);
    copy_async_commit();
    auto score = [&](int nb, int e) -> float& { return s[nb][e]; };
    float al0, al1;
    attn::softmax_tile(score, k0, t, pos0, pos1, sl2, m0, m1, l0, l1, al0, al1);
#pragma unroll
    for (int n = 0; n < kDimBlocks; ++n) {
      o[n][0] = o[n][0] * al0;
      o[n][1] = o[n][1] * al0;
      o[n][2] = o[n][2] * al1;
      o[n][3] = o[n][3] * al1;
    }
    uint32_t pa[4][4];
    attn::probability_fragments(score, pa);
    copy_async_wait<1>();  // V(kt)
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int nd = 0; nd < kDimBlocks; nd += 2) {
        // B = V with .trans: matrix i of the ldmatrix is keys +8 (i & 1), dims +8 (i >> 1).
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, vb_row + kk * 16 * kLd + nd * 8);
        attn::mma_bf16(o[nd], pa[kk], vb[0], vb[1]);
        attn::mma_bf16(o[nd + 1], pa[kk], vb[2], vb[3]);
      }
    }
    __syncthreads();
    if (kt + 1 < tiles) attn::issue_kv_tile(vs, vc, kvw, kh, D, k0 + kAttnTile, max_pos + 1);
    copy_async_commit();
  }
  attn::write_gated_rows<D>(a, h, rb, nr, warp, g, t, pos0, pos1, l0, l1,
                            [&](int n, int e) { return o[n][e]; });
}

template <typename F>
bool with_head_dim(int D, F&& f) {
  return with_one_of<32, 64, 128, 256>(D, f);
}

}  // namespace

bool attn_prefill_supported(const AttentionLaunch& a) {
  size_t need = 0;
  const bool dim_ok = with_head_dim(a.head_dim, [&](auto d) { need = smem_bytes<decltype(d)::value>(); });
  return a.cache_bf16 && dim_ok && need <= a.smem_limit;
}

void launch_attn_prefill(const AttentionLaunch& a, const float* qbuf, cudaStream_t stream) {
  if (attn_prefill_wgmma_takes(a)) {
    launch_attn_prefill_wgmma(a, qbuf, stream);
    return;
  }
  // Head-major grid: the heads of one KV group run side by side and share its key tiles in L2.
  const dim3 grid(static_cast<unsigned>(a.num_heads),
                  static_cast<unsigned>((a.rows + kRows - 1) / kRows + 1));
  with_head_dim(a.head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    launch_pdl(attn_prefill_kernel<D>, grid, dim3(kThreads), smem_bytes<D>(), stream, a, qbuf);
  });
}

void set_attn_prefill_smem_limit(size_t bytes) {
  for (int D : {32, 64, 128, 256}) {
    with_head_dim(D, [&](auto d) {
      cudaFuncSetAttribute(attn_prefill_kernel<decltype(d)::value>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    });
  }
}

}  // namespace pd::cuda
