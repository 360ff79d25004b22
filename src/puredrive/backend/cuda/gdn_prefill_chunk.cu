// Gated DeltaNet prefill, passes 1 and 2 of a segment (the algorithm: gdn_prefill.cu): the rows' conv, norms
// and gates, then each chunk's G, P, T, U and W.
#include "puredrive/backend/cuda/gdn_prefill.cuh"

namespace pd::cuda::gdn_prefill {
namespace {

constexpr int kTS = kChunk + 1;  // row stride of the chunk kernel's [64, 64] tiles (no bank conflicts)

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

}  // namespace

size_t chunk_smem_floats(int dk, int dv) {
  return static_cast<size_t>(kChunk) * quad_pitch(dk) +
         static_cast<size_t>(kChunk) * quad_pitch(dk > dv ? dk : dv) + 2 * kChunk * kTS + 3 * kChunk;
}

void launch_prep(const GdnLaunch& g, int r0, int seg_rows, cudaStream_t stream) {
  launch_pdl(gdn_prefill_prep_kernel, dim3(seg_rows), dim3(kThreads), 0, stream, g, r0);
}

void launch_chunk_pass(const GdnLaunch& g, int seg_rows, int first_len, int n_chunks, cudaStream_t stream) {
  with_key_dim(g.k_head_dim, [&](auto dk) {
    launch_pdl(gdn_prefill_chunk_kernel<dk()>, dim3(n_chunks, g.num_v_heads), dim3(kThreads),
               chunk_smem_floats(dk(), g.v_head_dim) * sizeof(float), stream, g, seg_rows, first_len);
  });
}

void set_chunk_smem_limit(size_t bytes) {
  for (int key_dim : kKeyDims) {
    with_key_dim(key_dim, [&](auto dk) {
      cudaFuncSetAttribute(gdn_prefill_chunk_kernel<dk()>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes));
    });
  }
}

}  // namespace pd::cuda::gdn_prefill
