// Gated DeltaNet prefill, passes 3 and 4 of a segment (the algorithm: gdn_prefill.cu): the state carried
// through the segment's chunks, then every chunk's outputs from the state before it.
#include "puredrive/backend/cuda/gdn_prefill.cuh"

namespace pd::cuda::gdn_prefill {
namespace {

// The state kernel's blocks: fewer threads than the others, so each thread holds more sums in registers
// and reads shared memory less per multiply-add (its time was shared-memory reads: L1 88% busy at 256
// threads with four sums each).
constexpr int kStateThreads = 128;

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

}  // namespace

size_t state_smem_floats(int dk, int cols) {
  return static_cast<size_t>(dk) * cols + 2 * static_cast<size_t>(kChunk) * quad_pitch(dk) + kChunk * cols +
         3 * kChunk;
}

size_t out_smem_floats(int dk) {
  return static_cast<size_t>(dk) * kTP + static_cast<size_t>(dk) * kOutCols + kChunk * kTP +
         kChunk * kOutCols + kChunk;
}

void launch_state_pass(const GdnLaunch& g, int seg_rows, int first_len, int n_chunks, cudaStream_t stream) {
  // 16 columns per block: 256 blocks for 32 value heads of 128 columns. Alone under ncu, 32 columns (128
  // blocks) finish sooner (263 against 275 us at the 35B shape), but in the step they prefilled an 8K prompt
  // at 13.86K tok/s against 14.48K (same run, bench/results/2026-12-04-h200-7481c48-prefill.md).
  // PD_GDN_STATE_COLS16=0: 32, for same-run comparisons; the sums are the same either way.
  static const bool narrow = env_switch_on("PD_GDN_STATE_COLS16");
  with_key_dim(g.k_head_dim, [&](auto dk) {
    if (narrow) {
      launch_pdl(gdn_prefill_state_kernel<dk(), 16>, dim3(g.num_v_heads, grid_for(g.v_head_dim, 16)),
                 dim3(kStateThreads), state_smem_floats(dk(), 16) * sizeof(float), stream, g, seg_rows,
                 first_len, n_chunks);
    } else {
      launch_pdl(gdn_prefill_state_kernel<dk(), 32>, dim3(g.num_v_heads, grid_for(g.v_head_dim, 32)),
                 dim3(kStateThreads), state_smem_floats(dk(), 32) * sizeof(float), stream, g, seg_rows,
                 first_len, n_chunks);
    }
  });
}

void launch_out_pass(const GdnLaunch& g, int r0, int seg_rows, int first_len, int n_chunks,
                     cudaStream_t stream) {
  with_key_dim(g.k_head_dim, [&](auto dk) {
    launch_pdl(gdn_prefill_out_kernel<dk()>, dim3(n_chunks, g.num_v_heads, grid_for(g.v_head_dim, kOutCols)),
               dim3(kThreads), out_smem_floats(dk()) * sizeof(float), stream, g, r0, seg_rows, first_len);
  });
}

void set_state_out_smem_limit(size_t bytes) {
  for (int key_dim : kKeyDims) {
    with_key_dim(key_dim, [&](auto dk) {
      for (auto* k : {gdn_prefill_state_kernel<dk(), 16>, gdn_prefill_state_kernel<dk(), 32>}) {
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
      }
      cudaFuncSetAttribute(gdn_prefill_out_kernel<dk()>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes));
    });
  }
}

}  // namespace pd::cuda::gdn_prefill
