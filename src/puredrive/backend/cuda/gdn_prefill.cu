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
#include "puredrive/backend/cuda/gdn_prefill.cuh"

namespace pd::cuda {
namespace {

using namespace gdn_prefill;

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
  set_chunk_smem_limit(bytes);
  set_state_out_smem_limit(bytes);
}

void launch_gated_delta_net_prefill(const GdnLaunch& g, cudaStream_t stream) {
  if (g.rows <= 0) return;
  auto smaller = [](int a, int b) { return a < b ? a : b; };
  for (int r0 = 0; r0 < g.rows;) {
    // Chunk boundaries where the absolute position is a multiple of kChunk.
    const int first_len = smaller(g.rows - r0, r0 == 0 ? kChunk - g.chunk_offset : kChunk);
    const int seg_rows = smaller(g.rows - r0, first_len + (kGdnSegmentChunks - 1) * kChunk);
    const int n_chunks = 1 + (seg_rows - first_len + kChunk - 1) / kChunk;
    launch_prep(g, r0, seg_rows, stream);
    launch_chunk_pass(g, seg_rows, first_len, n_chunks, stream);
    launch_state_pass(g, seg_rows, first_len, n_chunks, stream);
    launch_out_pass(g, r0, seg_rows, first_len, n_chunks, stream);
    r0 += seg_rows;
  }
  launch_pdl(gdn_prefill_norm_kernel,
             dim3(grid_for(static_cast<int64_t>(g.rows) * g.num_v_heads * 32, kThreads)), dim3(kThreads), 0,
             stream, g);
  launch_pdl(gdn_prefill_conv_state_kernel, dim3(grid_for(channels_of(g), 128)), dim3(128), 0, stream, g);
}

}  // namespace pd::cuda
