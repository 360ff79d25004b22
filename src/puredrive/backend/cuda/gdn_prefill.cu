// Gated DeltaNet prefill (backend.h GatedDeltaNetArgs with prefill set): the chunked form of spec §5.7 over
// chunks of kGdnPrefillChunk positions aligned to absolute positions, the math of the CPU backend's
// gdn_chunked.cpp (same terms, same order inside each sum, so the two differ only where expf and the
// compilers' libraries do). The step is cut into segments of at most kGdnSegmentChunks chunks (bounding the
// scratch); per segment:
// 1. prep (block per row): causal conv + SiLU over q|k|v with the conv kernel's arithmetic, l2norm of q and k
//    per key head (q scaled by Dk^-1/2), beta and the log decay g per value head;
// 2. chunk (block per chunk and value head): G = running sum of g, N[i][j] = beta_i (k_i . k_j) e^(G_i - G_j)
//    (j < i) and P[i][j] = (q_i . k_j) e^(G_i - G_j) (j <= i), T = (I + N)^-1 - I by forward substitution,
//    U = (I + T) diag(beta) V, W = (I + T) diag(beta e^G) K;
// 3. state (block per value head and 16 state columns, the segment's chunks in order): S_c (the state
//    before chunk c) kept, v' = U - W S (over U), S <- e^G_last S + (K e^(G_last - G))^T v';
// 4. out (block per chunk, value head and 64 columns, all at once): o = (q e^G) S_c + P v'.
// Then the gated RMSNorm of every row and head (a warp each) and the conv state's new window.
// Every sum runs in a fixed order that depends only on its chunk's rows (explicit fmaf, --fmad=false): a
// chunk's results do not depend on the rows around it in the step, so prefill pieces split at multiples of
// 64 positions give the bits of one piece (docs/DESIGN.md §4.6).
#include "puredrive/backend/cuda/common.cuh"

namespace pd::cuda {
namespace {

constexpr int kChunk = kGdnPrefillChunk;
constexpr int kThreads = 256;
constexpr int kTS = kChunk + 1;  // row stride of the [64, 64] shared tiles (no bank conflicts)

// e^x for a log decay x <= 0, or 0 below e^-50: as the CPU backend (gdn_chunked.cpp, which flushes these for
// speed); every sum has an undecayed term next to which such a term never shows in fp32.
__device__ __forceinline__ float decay_factor(float x) {
  return x < -50.0f ? 0.0f : expf(x);
}

// The per-segment scratch (gdn_prefill_scratch_floats), rows indexed from the segment's first row.
struct PrefillScratch {
  float* xn;    // [rows, C]: SiLU(conv), q and k l2-normalised
  float* beta;  // [rows, Hv]
  float* g;     // [rows, Hv]: log decays
  float* G;     // [rows, Hv]: running sums of g inside each chunk
  float* u;     // [rows, Hv * Dv]
  float* w;     // [rows, Hv * Dk]
  float* p;     // [chunks, Hv, 64 * 64]
  float* snap;  // [chunks, Hv, Dk * Dv]: the state before each chunk
};

__host__ __device__ inline int64_t channels_of(const GdnLaunch& g) {
  return 2 * int64_t{g.num_k_heads} * g.k_head_dim + int64_t{g.num_v_heads} * g.v_head_dim;
}

__host__ __device__ inline int64_t scratch_floats(int64_t channels, int hv, int dk, int dv,
                                                  const GdnPrefillCaps& caps) {
  return int64_t{caps.rows} * (channels + 3 * int64_t{hv} + int64_t{hv} * (dk + dv)) +
         int64_t{caps.chunks} * hv * (kChunk * kChunk + int64_t{dk} * dv);
}

__device__ inline PrefillScratch prefill_scratch(const GdnLaunch& g) {
  const int64_t rows = g.seg_rows_cap, hv = g.num_v_heads;
  PrefillScratch s;
  s.xn = g.scratch;
  s.beta = s.xn + rows * channels_of(g);
  s.g = s.beta + rows * hv;
  s.G = s.g + rows * hv;
  s.u = s.G + rows * hv;
  s.w = s.u + rows * hv * g.v_head_dim;
  s.p = s.w + rows * hv * g.k_head_dim;
  s.snap = s.p + int64_t{g.seg_chunks_cap} * hv * kChunk * kChunk;
  return s;
}

// Rows [0, L) of a [64, cols] slice (row i at src + i * stride) into a shared tile of row pitch `pitch`,
// zeros in rows L..63, by a block of NT threads. The copies are asynchronous, so all of a tile's are in
// flight at once (one memory latency, not one per trip of a loop); they land at copy_async_wait_all(), and
// the caller's next barrier publishes them. `quads`: 16-byte copies, for cols, pitch and stride multiples of
// 4 and 16-byte aligned src and dst.
template <int NT = kThreads>
__device__ __forceinline__ void stage_rows(float* dst, int pitch, const float* src, int64_t stride, int L,
                                           int cols, bool quads = false) {
  if (quads) {
    const int q = cols / 4;
    for (int e = static_cast<int>(threadIdx.x); e < kChunk * q; e += NT) {
      const int i = e / q, d = 4 * (e % q);
      if (i < L) {
        copy16_async(dst + i * pitch + d, src + i * stride + d);
      } else {
        *reinterpret_cast<float4*>(dst + i * pitch + d) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
    return;
  }
  for (int e = static_cast<int>(threadIdx.x); e < kChunk * cols; e += NT) {
    const int i = e / cols, d = e % cols;
    if (i < L) {
      copy4_async(dst + i * pitch + d, src + i * stride + d);
    } else {
      dst[i * pitch + d] = 0.0f;
    }
  }
}
// Each of NT threads multiplies elements of rows 0..L-1 by their row's factor (after the staged rows landed
// and a barrier published them, or for the elements this thread staged).
template <int NT = kThreads>
__device__ __forceinline__ void scale_rows(float* dst, int pitch, int L, int cols, const float* row_scale) {
  for (int e = static_cast<int>(threadIdx.x); e < L * cols; e += NT) {
    const int i = e / cols, d = e % cols;
    dst[i * pitch + d] *= row_scale[i];
  }
}

// out[i][c] = S(i, c) + sum_{m < i} T[i][m] S(m, c), the terms in ascending m after the diagonal, for rows
// i < L and columns c < cols (T strictly lower, [64][kTS]; S(m, c) reads staged rows). Warp w owns rows
// w + 8a and lane l columns c0 + l + 32b, so one load of T serves four columns and one of S eight rows.
template <class Src>
__device__ __forceinline__ void unit_lower_times(const float* Ts, int L, int cols, const Src& S, float* out,
                                                 int64_t out_stride) {
  constexpr int kRows = kChunk / (kThreads / 32), kCols = 4;
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  for (int c0 = 0; c0 < cols; c0 += 32 * kCols) {
    float acc[kRows][kCols];
#pragma unroll
    for (int a = 0; a < kRows; ++a) {
#pragma unroll
      for (int b = 0; b < kCols; ++b) {
        const int i = warp + 8 * a, c = c0 + lane + 32 * b;
        acc[a][b] = i < L && c < cols ? S(i, c) : 0.0f;
      }
    }
    for (int m = 0; m + 1 < L; ++m) {
      float x[kCols];
#pragma unroll
      for (int b = 0; b < kCols; ++b) {
        const int c = c0 + lane + 32 * b;
        x[b] = c < cols ? S(m, c) : 0.0f;
      }
#pragma unroll
      for (int a = 0; a < kRows; ++a) {
        const int i = warp + 8 * a;
        if (m >= i) continue;  // uniform over the warp
        const float t = Ts[i * kTS + m];
#pragma unroll
        for (int b = 0; b < kCols; ++b) acc[a][b] = fmaf(t, x[b], acc[a][b]);
      }
    }
#pragma unroll
    for (int a = 0; a < kRows; ++a) {
#pragma unroll
      for (int b = 0; b < kCols; ++b) {
        const int i = warp + 8 * a, c = c0 + lane + 32 * b;
        if (i < L && c < cols) out[i * out_stride + c] = acc[a][b];
      }
    }
  }
}

// Four floats from a 16-byte aligned shared address into registers.
__device__ __forceinline__ void load4(float (&out)[4], const float* p) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  out[0] = v.x;
  out[1] = v.y;
  out[2] = v.z;
  out[3] = v.w;
}

// Chunk c of a segment whose first chunk has first_len rows: its first row (in the segment) and length.
__device__ __forceinline__ int chunk_start(int c, int first_len) {
  return c == 0 ? 0 : first_len + (c - 1) * kChunk;
}
__device__ __forceinline__ int chunk_len(int c, int first_len, int seg_rows) {
  const int start = chunk_start(c, first_len);
  return min(seg_rows - start, c == 0 ? first_len : kChunk);
}

// 1. Rows [r0, r0 + gridDim.x) of the step: conv + SiLU, l2norm, gates.
__global__ void __launch_bounds__(kThreads) gdn_prefill_prep_kernel(GdnLaunch g, int r0) {
  pdl_enter();
  const int dk = g.k_head_dim, hk = g.num_k_heads, hv = g.num_v_heads, kc = g.conv_kernel;
  const int64_t C = channels_of(g);
  const int local = static_cast<int>(blockIdx.x);
  const int row = r0 + local;
  const PrefillScratch s = prefill_scratch(g);
  float* x = s.xn + local * C;
  for (int64_t c = threadIdx.x; c < C; c += kThreads) {
    // The window [x_{row-Kc+1} .. x_row], inputs before the step from the conv state; the conv kernel's sum.
    float acc = 0.0f;
    for (int j = 0; j < kc; ++j) {
      const int t = row - (kc - 1) + j;
      const float in = t >= 0 ? g.qkv[static_cast<int64_t>(t) * g.qkv_stride + c]
                              : g.conv_state[static_cast<int64_t>(kc - 1 + t) * C + c];
      const float w = g.conv1d[c * kc + j];
      acc = j == 0 ? w * in : acc + w * in;
    }
    x[c] = siluf_(acc);
  }
  __syncthreads();
  // l2norm per q and k head (eps 1e-6 inside the root, FLA / HF), a warp per head: lane sums in order, then
  // the xor butterfly.
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const float q_scale = static_cast<float>(1.0 / sqrt(static_cast<double>(dk)));
  for (int head = warp; head < 2 * hk; head += kThreads / 32) {
    float* v = x + static_cast<int64_t>(head) * dk;  // q heads, then k heads
    float ss = 0.0f;
    for (int i = lane; i < dk; i += 32) ss = fmaf(v[i], v[i], ss);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    const float inv = 1.0f / sqrtf(ss + 1e-6f);
    for (int i = lane; i < dk; i += 32) v[i] = head < hk ? (v[i] * inv) * q_scale : v[i] * inv;
  }
  for (int h = static_cast<int>(threadIdx.x); h < hv; h += kThreads) {
    s.beta[static_cast<int64_t>(local) * hv + h] = sigmoidf_(g.b[static_cast<int64_t>(row) * g.b_stride + h]);
    s.g[static_cast<int64_t>(local) * hv + h] =
        -expf(g.A_log[h]) * softplusf_(g.a[static_cast<int64_t>(row) * g.a_stride + h] + g.dt_bias[h]);
  }
}

// Row pitch of the shared tiles read as float4 rows (N and P of the chunk kernel, W and K of the state
// kernel): rows stay 16-byte aligned, and eight rows' float4s fall in eight different bank groups.
__host__ __device__ constexpr int quad_pitch(int cols) {
  return cols + 4;
}

size_t chunk_smem_floats(int dk, int dv) {
  return static_cast<size_t>(kChunk) * quad_pitch(dk) +
         static_cast<size_t>(kChunk) * quad_pitch(dk > dv ? dk : dv) + 2 * kChunk * kTS + 3 * kChunk;
}

// 2. Chunk blockIdx.x of the segment, value head blockIdx.y: G, P, T, U, W.
template <int DK>
__global__ void __launch_bounds__(kThreads)
    gdn_prefill_chunk_kernel(GdnLaunch g, int seg_rows, int first_len) {
  pdl_enter();
  extern __shared__ __align__(16) float smem[];
  const int dv = g.v_head_dim, hv = g.num_v_heads;
  const int64_t key_dim = int64_t{g.num_k_heads} * DK;
  const int64_t C = channels_of(g);
  const int c = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y);
  const int kh = h / (hv / g.num_k_heads);
  const int start = chunk_start(c, first_len), L = chunk_len(c, first_len, seg_rows);
  const PrefillScratch s = prefill_scratch(g);
  constexpr int KS = quad_pitch(DK);
  const int XS = quad_pitch(DK > dv ? DK : dv);
  float* Ks = smem;               // [64][KS] k
  float* Xs = Ks + kChunk * KS;   // [64][XS] q, then beta v
  float* Ns = Xs + kChunk * XS;   // [64][kTS]
  float* Ts = Ns + kChunk * kTS;  // [64][kTS], strictly lower
  float* Gs = Ts + kChunk * kTS;  // [64]
  float* Bs = Gs + kChunk;        // [64] beta
  float* BGs = Bs + kChunk;       // [64] beta e^G
  const int tid = static_cast<int>(threadIdx.x);
  // 16-byte copies where the rows allow them (every shape but odd test ones).
  const bool quads = C % 4 == 0 && dv % 4 == 0 && reinterpret_cast<uintptr_t>(s.xn) % 16 == 0;

  stage_rows(Ks, KS, s.xn + start * C + key_dim + kh * DK, C, L, DK, quads);
  stage_rows(Xs, XS, s.xn + start * C + kh * DK, C, L, DK, quads);
  for (int e = tid; e < kChunk * kTS; e += kThreads) Ts[e] = 0.0f;
  if (tid < kChunk) {
    Bs[tid] = tid < L ? s.beta[static_cast<int64_t>(start + tid) * hv + h] : 0.0f;
    Gs[tid] = tid < L ? s.g[static_cast<int64_t>(start + tid) * hv + h] : 0.0f;  // g, summed below
  }
  __syncthreads();
  if (tid == 0) {
    float acc = 0.0f;
    for (int i = 0; i < L; ++i) {
      acc = i == 0 ? Gs[i] : acc + Gs[i];
      Gs[i] = acc;
    }
  }
  copy_async_wait_all();
  __syncthreads();
  if (tid < L) {
    s.G[static_cast<int64_t>(start + tid) * hv + h] = Gs[tid];
    BGs[tid] = Bs[tid] * decay_factor(Gs[tid]);
  }

  // N and P: thread (ti, tj) owns rows ti + 16a and columns tj + 16b (blocks above the diagonal skipped), so
  // one load of a k or q row serves four products; every sum runs over the key dim in ascending order.
  float* P = s.p + (static_cast<int64_t>(c) * hv + h) * kChunk * kChunk;
  {
    const int ti = tid / 16, tj = tid % 16;
    float kk[4][4] = {}, qk[4][4] = {};
    for (int d = 0; d < DK; d += 4) {
      float ki[4][4], qi[4][4], kj[4][4];  // [row][key dim d + e]
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        load4(ki[a], Ks + (ti + 16 * a) * KS + d);
        load4(qi[a], Xs + (ti + 16 * a) * XS + d);
        load4(kj[a], Ks + (tj + 16 * a) * KS + d);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
#pragma unroll
        for (int a = 0; a < 4; ++a) {
#pragma unroll
          for (int b = 0; b <= a; ++b) {
            kk[a][b] = fmaf(ki[a][e], kj[b][e], kk[a][b]);
            qk[a][b] = fmaf(qi[a][e], kj[b][e], qk[a][b]);
          }
        }
      }
    }
#pragma unroll
    for (int a = 0; a < 4; ++a) {
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int i = ti + 16 * a, j = tj + 16 * b;
        float n = 0.0f, pv = 0.0f;
        if (b <= a && i < L && j <= i) {
          const float decay = decay_factor(Gs[i] - Gs[j]);
          if (j < i) n = (Bs[i] * kk[a][b]) * decay;
          pv = qk[a][b] * decay;
        }
        Ns[i * kTS + j] = n;
        P[i * kChunk + j] = pv;
      }
    }
  }
  __syncthreads();

  // T[i][j] = -(N[i][j] + sum_{j < m < i} N[i][m] T[m][j]), rows in order.
  for (int i = 1; i < L; ++i) {
    if (tid < i) {
      float acc = Ns[i * kTS + tid];
      for (int m = tid + 1; m < i; ++m) acc = fmaf(Ns[i * kTS + m], Ts[m * kTS + tid], acc);
      Ts[i * kTS + tid] = -acc;
    }
    __syncthreads();
  }

  stage_rows(Xs, XS, s.xn + start * C + 2 * key_dim + static_cast<int64_t>(h) * dv, C, L, dv, quads);
  copy_async_wait_all();
  __syncthreads();  // the 16-byte copies' elements are not the ones scale_rows gives each thread
  scale_rows(Xs, XS, L, dv, Bs);
  __syncthreads();
  // U = (I + T) diag(beta) V and W = (I + T) diag(beta e^G) K, the terms in ascending m after the diagonal.
  const int64_t u_stride = int64_t{hv} * dv, w_stride = int64_t{hv} * DK;
  float* U = s.u + start * u_stride + static_cast<int64_t>(h) * dv;
  unit_lower_times(
      Ts, L, dv, [&](int m, int cc) { return Xs[m * XS + cc]; }, U, u_stride);
  float* W = s.w + start * w_stride + static_cast<int64_t>(h) * DK;
  unit_lower_times(
      Ts, L, DK, [&](int m, int d) { return Ks[m * KS + d] * BGs[m]; }, W, w_stride);
}

// The state kernel's blocks: fewer threads than the others, so each thread holds more sums in registers
// and reads shared memory less per multiply-add (its time was shared-memory reads: L1 88% busy at 256
// threads with four sums each).
constexpr int kStateThreads = 128;

size_t state_smem_floats(int dk, int cols) {
  return static_cast<size_t>(dk) * cols + 2 * static_cast<size_t>(kChunk) * quad_pitch(dk) + kChunk * cols +
         3 * kChunk;
}

// A block of the state kernel owns COLS state columns: thread (rg, cq) owns columns 4 cq .. 4 cq + 3, the
// chunk rows rg + kRowGroups r (kRows of them) of v', and the state rows 4 (rg + kRowGroups k) + j.
template <int COLS>
struct StateTiling {
  static constexpr int kColGroups = COLS / 4;
  static constexpr int kRowGroups = kStateThreads / kColGroups;
  static constexpr int kRows = kChunk / kRowGroups;
  static_assert(kRows * kRowGroups == kChunk, "whole chunk rows per thread");
};

// The chunk's 64 rows of A (staged, [64][quad_pitch(DK)]) times the state block, the thread's rows and
// columns (StateTiling), each summed over the key dim in ascending order; four key dims per shared-memory
// read.
template <int DK, int COLS>
__device__ __forceinline__ void times_state(const float* As, const float* Ss, int rg, int cq,
                                            float acc[StateTiling<COLS>::kRows][4]) {
  constexpr int kRows = StateTiling<COLS>::kRows, kRowGroups = StateTiling<COLS>::kRowGroups;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[r][q] = 0.0f;
  }
  for (int d = 0; d < DK; d += 4) {
    float sv[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) load4(sv[j], Ss + (d + j) * COLS + 4 * cq);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float a[4];
      load4(a, As + (rg + kRowGroups * r) * quad_pitch(DK) + d);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[r][q] = fmaf(a[j], sv[j][q], acc[r][q]);
      }
    }
  }
}

// 3. Value head blockIdx.x, state columns [COLS blockIdx.y, COLS blockIdx.y + COLS): the segment's chunks in
// order. Only this chain is sequential, so it does no more than it must: the outputs are the out kernel's.
// Chunk c + 1's W comes in while chunk c's state is updated, and chunk c's K while its v' is computed.
template <int DK, int COLS>
__global__ void __launch_bounds__(kStateThreads)
    gdn_prefill_state_kernel(GdnLaunch g, int seg_rows, int first_len, int n_chunks) {
  pdl_enter();
  extern __shared__ __align__(16) float smem[];
  const int dv = g.v_head_dim, hv = g.num_v_heads;
  const int64_t key_dim = int64_t{g.num_k_heads} * DK;
  const int64_t C = channels_of(g);
  const int h = static_cast<int>(blockIdx.x), col0 = static_cast<int>(blockIdx.y) * COLS;
  constexpr int kRows = StateTiling<COLS>::kRows, kRowGroups = StateTiling<COLS>::kRowGroups;
  constexpr int AS = quad_pitch(DK);
  const int kh = h / (hv / g.num_k_heads);
  const PrefillScratch s = prefill_scratch(g);
  float* Ss = smem;                // [DK][COLS]: the state block
  float* Ws = Ss + DK * COLS;      // [64][AS]: W
  float* Ks = Ws + kChunk * AS;    // [64][AS]: K e^(G_last - G)
  float* Vs = Ks + kChunk * AS;    // [64][COLS]: v'
  float* Gb = Vs + kChunk * COLS;  // [2][64]: G of chunks c and c + 1
  float* KDs = Gb + 2 * kChunk;    // [64] e^(G_last - G)
  const int tid = static_cast<int>(threadIdx.x);
  const int cq = tid % StateTiling<COLS>::kColGroups, rg = tid / StateTiling<COLS>::kColGroups;
  const int64_t u_stride = int64_t{hv} * dv, w_stride = int64_t{hv} * DK;
  const float* w_src = s.w + static_cast<int64_t>(h) * DK;
  const float* k_src = s.xn + key_dim + kh * DK;
  // 16-byte copies where the rows allow them (every shape but odd test ones).
  const bool quads = w_stride % 4 == 0 && C % 4 == 0 && reinterpret_cast<uintptr_t>(w_src) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(k_src) % 16 == 0;
  float* state = g.recurrent + static_cast<int64_t>(h) * DK * dv;
  for (int e = tid; e < DK * COLS; e += kStateThreads) {
    const int d = e / COLS, col = col0 + e % COLS;
    Ss[e] = col < dv ? state[static_cast<int64_t>(d) * dv + col] : 0.0f;
  }
  auto stage_w = [&](int c) {
    const int start = chunk_start(c, first_len), L = chunk_len(c, first_len, seg_rows);
    stage_rows<kStateThreads>(Ws, AS, w_src + start * w_stride, w_stride, L, DK, quads);
    if (tid < kChunk) {
      Gb[(c & 1) * kChunk + tid] = tid < L ? s.G[static_cast<int64_t>(start + tid) * hv + h] : 0.0f;
    }
  };
  stage_w(0);
  copy_async_wait_all();
  __syncthreads();
  for (int c = 0; c < n_chunks; ++c) {
    const int start = chunk_start(c, first_len), L = chunk_len(c, first_len, seg_rows);
    const float* G = Gb + (c & 1) * kChunk;
    // K comes into the buffer the last chunk's update has left (behind its closing barrier).
    stage_rows<kStateThreads>(Ks, AS, k_src + start * C, C, L, DK, quads);
    float* snap = s.snap + (static_cast<int64_t>(c) * hv + h) * DK * dv;
    for (int e = tid; e < DK * COLS; e += kStateThreads) {
      const int d = e / COLS, col = col0 + e % COLS;
      if (col < dv) snap[static_cast<int64_t>(d) * dv + col] = Ss[e];
    }
    if (tid < kChunk) KDs[tid] = tid < L ? decay_factor(G[L - 1] - G[tid]) : 0.0f;
    const float e_last = decay_factor(G[L - 1]);

    // v' = U - W S, written over U for the out kernel.
    float acc[kRows][4];
    times_state<DK, COLS>(Ws, Ss, rg, cq, acc);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int i = rg + kRowGroups * r;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int col = col0 + 4 * cq + q;
        float v = 0.0f;
        if (i < L && col < dv) {
          float* u = s.u + (start + i) * u_stride + static_cast<int64_t>(h) * dv + col;
          v = *u - acc[r][q];
          *u = v;
        }
        Vs[i * COLS + 4 * cq + q] = v;
      }
    }
    copy_async_wait_all();
    __syncthreads();  // v', the decays and K are in; W is no longer read
    scale_rows<kStateThreads>(Ks, AS, L, DK, KDs);
    if (c + 1 < n_chunks) stage_w(c + 1);
    __syncthreads();

    // S <- e^G_last S + (K e^(G_last - G))^T v': thread (rg, cq) owns state rows 4 (rg + kRowGroups k) + j,
    // each summed over m in ascending order after the decayed state.
    for (int d0 = 4 * rg; d0 < DK; d0 += 4 * kRowGroups) {
      float a[4][4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        load4(a[j], Ss + (d0 + j) * COLS + 4 * cq);
#pragma unroll
        for (int q = 0; q < 4; ++q) a[j][q] = a[j][q] * e_last;
      }
      for (int m = 0; m < L; ++m) {
        float kd[4], v[4];
        load4(kd, Ks + m * AS + d0);
        load4(v, Vs + m * COLS + 4 * cq);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
          for (int q = 0; q < 4; ++q) a[j][q] = fmaf(kd[j], v[q], a[j][q]);
        }
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        *reinterpret_cast<float4*>(Ss + (d0 + j) * COLS + 4 * cq) =
            make_float4(a[j][0], a[j][1], a[j][2], a[j][3]);
      }
    }
    copy_async_wait_all();
    __syncthreads();  // the state, the next W and G are in
  }
  for (int e = tid; e < DK * COLS; e += kStateThreads) {
    const int d = e / COLS, col = col0 + e % COLS;
    if (col < dv) state[static_cast<int64_t>(d) * dv + col] = Ss[e];
  }
}

constexpr int kOutCols = 64;     // value columns per block of the out kernel
constexpr int kTP = kChunk + 4;  // row pitch of its transposed tiles (float4 rows)
size_t out_smem_floats(int dk) {
  return static_cast<size_t>(dk) * kTP + static_cast<size_t>(dk) * kOutCols + kChunk * kTP +
         kChunk * kOutCols + kChunk;
}

// 4. Chunk blockIdx.x of the segment, value head blockIdx.y, columns [64 blockIdx.z, + 64): o = (q e^G) S_c +
// P v' for step rows r0 + start + i. Thread (ty, tx) owns rows 4 ty .. 4 ty + 3 and columns 4 tx .. 4 tx + 3;
// each term summed as the fused kernel did (key dim ascending, then m ascending up to the row), so the
// outputs keep their bits.
template <int DK>
__global__ void __launch_bounds__(kThreads)
    gdn_prefill_out_kernel(GdnLaunch g, int r0, int seg_rows, int first_len) {
  pdl_enter();
  extern __shared__ __align__(16) float smem[];
  const int dv = g.v_head_dim, hv = g.num_v_heads;
  const int64_t C = channels_of(g);
  const int c = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y);
  const int col0 = static_cast<int>(blockIdx.z) * kOutCols;
  const int kh = h / (hv / g.num_k_heads);
  const int start = chunk_start(c, first_len), L = chunk_len(c, first_len, seg_rows);
  const PrefillScratch s = prefill_scratch(g);
  float* QT = smem;                    // [DK][kTP]: q e^G, transposed
  float* Sc = QT + DK * kTP;           // [DK][kOutCols]: the state before the chunk
  float* PT = Sc + DK * kOutCols;      // [64][kTP]: P transposed
  float* Vs = PT + kChunk * kTP;       // [64][kOutCols]: v'
  float* EG = Vs + kChunk * kOutCols;  // [64] e^G
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t u_stride = int64_t{hv} * dv;
  const float* snap = s.snap + (static_cast<int64_t>(c) * hv + h) * DK * dv;
  for (int e = tid; e < DK * kOutCols; e += kThreads) {
    const int d = e / kOutCols, col = col0 + e % kOutCols;
    if (col < dv) {
      copy4_async(Sc + e, snap + static_cast<int64_t>(d) * dv + col);
    } else {
      Sc[e] = 0.0f;
    }
  }
  for (int e = tid; e < kChunk * kOutCols; e += kThreads) {
    const int i = e / kOutCols, col = col0 + e % kOutCols;
    if (i < L && col < dv) {
      copy4_async(Vs + e, s.u + (start + i) * u_stride + static_cast<int64_t>(h) * dv + col);
    } else {
      Vs[e] = 0.0f;
    }
  }
  if (tid < kChunk) EG[tid] = tid < L ? decay_factor(s.G[static_cast<int64_t>(start + tid) * hv + h]) : 0.0f;
  const float* P = s.p + (static_cast<int64_t>(c) * hv + h) * kChunk * kChunk;
  for (int e = tid; e < kChunk * kChunk; e += kThreads) PT[(e % kChunk) * kTP + e / kChunk] = P[e];
  __syncthreads();  // EG
  for (int e = tid; e < kChunk * DK; e += kThreads) {
    const int i = e / DK, d = e % DK;
    QT[d * kTP + i] = i < L ? s.xn[(start + i) * C + kh * DK + d] * EG[i] : 0.0f;
  }
  copy_async_wait_all();
  __syncthreads();

  const int tx = tid % 16, ty = tid / 16;
  float acc[4][4] = {}, intra[4][4] = {};
  for (int d = 0; d < DK; ++d) {
    const float4 qv = *reinterpret_cast<const float4*>(QT + d * kTP + 4 * ty);
    const float4 sv = *reinterpret_cast<const float4*>(Sc + d * kOutCols + 4 * tx);
    const float q4[4] = {qv.x, qv.y, qv.z, qv.w}, s4[4] = {sv.x, sv.y, sv.z, sv.w};
#pragma unroll
    for (int a = 0; a < 4; ++a) {
#pragma unroll
      for (int b = 0; b < 4; ++b) acc[a][b] = fmaf(q4[a], s4[b], acc[a][b]);
    }
  }
  const int last = min(4 * ty + 3, L - 1);
  for (int m = 0; m <= last; ++m) {
    const float4 pv = *reinterpret_cast<const float4*>(PT + m * kTP + 4 * ty);
    const float4 vv = *reinterpret_cast<const float4*>(Vs + m * kOutCols + 4 * tx);
    const float p4[4] = {pv.x, pv.y, pv.z, pv.w}, v4[4] = {vv.x, vv.y, vv.z, vv.w};
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      if (m > 4 * ty + a) continue;
#pragma unroll
      for (int b = 0; b < 4; ++b) intra[a][b] = fmaf(p4[a], v4[b], intra[a][b]);
    }
  }
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    const int i = 4 * ty + a;
    if (i >= L) continue;
    float* out = g.out + static_cast<int64_t>(r0 + start + i) * g.out_stride + static_cast<int64_t>(h) * dv;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int col = col0 + 4 * tx + b;
      if (col < dv) out[col] = acc[a][b] + intra[a][b];
    }
  }
}

// Gated RMSNorm of every row and head in place, norm before gate: (w * (o * rsqrt(mean(o^2) + eps))) *
// silu(z); a warp per (row, head), lane sums in order, then the xor butterfly.
__global__ void __launch_bounds__(kThreads) gdn_prefill_norm_kernel(GdnLaunch g) {
  pdl_enter();
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int hv = g.num_v_heads, dv = g.v_head_dim;
  if (warp >= static_cast<int64_t>(g.rows) * hv) return;
  const int64_t r = warp / hv;
  const int h = static_cast<int>(warp % hv);
  float* o = g.out + r * g.out_stride + static_cast<int64_t>(h) * dv;
  const float* z = g.z + r * g.z_stride + static_cast<int64_t>(h) * dv;
  float ss = 0.0f;
  for (int j = lane; j < dv; j += 32) ss = fmaf(o[j], o[j], ss);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(dv) + g.eps);
  for (int j = lane; j < dv; j += 32) o[j] = (g.norm[j] * (o[j] * inv)) * siluf_(z[j]);
}

// The conv state after the step: the last Kc-1 inputs, from the step's rows or, for short steps, the old
// window.
__global__ void gdn_prefill_conv_state_kernel(GdnLaunch g) {
  pdl_enter();
  const int64_t C = channels_of(g);
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int keep = g.conv_kernel - 1;
  float win[kMaxConvKernel];
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j) {
    if (j < keep) {
      const int t = g.rows - keep + j;
      win[j] = t >= 0 ? g.qkv[static_cast<int64_t>(t) * g.qkv_stride + c]
                      : g.conv_state[static_cast<int64_t>(g.rows + j) * C + c];
    }
  }
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j) {
    if (j < keep) g.conv_state[static_cast<int64_t>(j) * C + c] = win[j];
  }
}

template <int DK>
void launch_segment(const GdnLaunch& g, int r0, int seg_rows, int first_len, int n_chunks,
                    cudaStream_t stream) {
  launch_pdl(gdn_prefill_chunk_kernel<DK>, dim3(n_chunks, g.num_v_heads), dim3(kThreads),
             chunk_smem_floats(DK, g.v_head_dim) * sizeof(float), stream, g, seg_rows, first_len);
  // 16 columns per block: 256 blocks for 32 value heads of 128 columns. Alone under ncu, 32 columns (128
  // blocks) finish sooner (263 against 275 us at the 35B shape), but in the step they prefilled an 8K prompt
  // at 13.86K tok/s against 14.48K (same run, bench/results/2026-12-04-h200-7481c48-prefill.md).
  // PD_GDN_STATE_COLS16=0: 32, for same-run comparisons; the sums are the same either way.
  static const bool narrow = env_switch_on("PD_GDN_STATE_COLS16");
  if (narrow) {
    launch_pdl(gdn_prefill_state_kernel<DK, 16>, dim3(g.num_v_heads, grid_for(g.v_head_dim, 16)),
               dim3(kStateThreads), state_smem_floats(DK, 16) * sizeof(float), stream, g, seg_rows, first_len,
               n_chunks);
  } else {
    launch_pdl(gdn_prefill_state_kernel<DK, 32>, dim3(g.num_v_heads, grid_for(g.v_head_dim, 32)),
               dim3(kStateThreads), state_smem_floats(DK, 32) * sizeof(float), stream, g, seg_rows, first_len,
               n_chunks);
  }
  launch_pdl(gdn_prefill_out_kernel<DK>, dim3(n_chunks, g.num_v_heads, grid_for(g.v_head_dim, kOutCols)),
             dim3(kThreads), out_smem_floats(DK) * sizeof(float), stream, g, r0, seg_rows, first_len);
}

template <int DK>
void set_limit(size_t bytes) {
  cudaFuncSetAttribute(gdn_prefill_chunk_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(bytes));
  for (auto* k : {gdn_prefill_state_kernel<DK, 16>, gdn_prefill_state_kernel<DK, 32>}) {
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  }
  cudaFuncSetAttribute(gdn_prefill_out_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(bytes));
}

}  // namespace

GdnPrefillCaps gdn_prefill_caps(int rows) {
  constexpr int seg_rows = kGdnSegmentChunks * kChunk;
  // A segment starts on a chunk boundary; only the step's first chunk can be partial at its start.
  return {.rows = rows < seg_rows ? rows : seg_rows,
          .chunks = rows / kChunk + 2 < kGdnSegmentChunks ? rows / kChunk + 2 : kGdnSegmentChunks};
}

int64_t gdn_prefill_scratch_floats(int channels, int num_v_heads, int k_head_dim, int v_head_dim, int rows) {
  return scratch_floats(channels, num_v_heads, k_head_dim, v_head_dim, gdn_prefill_caps(rows));
}

size_t gdn_prefill_smem_bytes(int k_head_dim, int v_head_dim) {
  const size_t a = chunk_smem_floats(k_head_dim, v_head_dim), b = state_smem_floats(k_head_dim, 32);
  const size_t c = out_smem_floats(k_head_dim), ab = a > b ? a : b;
  return (ab > c ? ab : c) * sizeof(float);
}

void set_gdn_prefill_smem_limit(size_t bytes) {
  set_limit<16>(bytes);
  set_limit<32>(bytes);
  set_limit<64>(bytes);
  set_limit<128>(bytes);
  set_limit<256>(bytes);
}

void launch_gated_delta_net_prefill(const GdnLaunch& g, cudaStream_t stream) {
  if (g.rows <= 0) return;
  auto smaller = [](int a, int b) { return a < b ? a : b; };
  for (int r0 = 0; r0 < g.rows;) {
    // Chunk boundaries where the absolute position is a multiple of kChunk.
    const int first_len = smaller(g.rows - r0, r0 == 0 ? kChunk - g.chunk_offset : kChunk);
    const int seg_rows = smaller(g.rows - r0, first_len + (kGdnSegmentChunks - 1) * kChunk);
    const int n_chunks = 1 + (seg_rows - first_len + kChunk - 1) / kChunk;
    launch_pdl(gdn_prefill_prep_kernel, dim3(seg_rows), dim3(kThreads), 0, stream, g, r0);
    switch (g.k_head_dim) {
      case 16:
        launch_segment<16>(g, r0, seg_rows, first_len, n_chunks, stream);
        break;
      case 32:
        launch_segment<32>(g, r0, seg_rows, first_len, n_chunks, stream);
        break;
      case 64:
        launch_segment<64>(g, r0, seg_rows, first_len, n_chunks, stream);
        break;
      case 128:
        launch_segment<128>(g, r0, seg_rows, first_len, n_chunks, stream);
        break;
      default:
        launch_segment<256>(g, r0, seg_rows, first_len, n_chunks, stream);
        break;
    }
    r0 += seg_rows;
  }
  launch_pdl(gdn_prefill_norm_kernel,
             dim3(grid_for(static_cast<int64_t>(g.rows) * g.num_v_heads * 32, kThreads)), dim3(kThreads), 0,
             stream, g);
  launch_pdl(gdn_prefill_conv_state_kernel, dim3(grid_for(channels_of(g), 128)), dim3(128), 0, stream, g);
}

}  // namespace pd::cuda
