// Gated DeltaNet after the input projections (backend.h GatedDeltaNetArgs; spec §5), rows in order, per chunk
// of up to kGdnChunk rows:
// 1. conv: one thread per channel carries the Kc-1 window through the rows (causal depthwise conv + SiLU),
//    writing the per-row conv snapshots and the final window;
// 2. recurrence: one block per value head keeps S_h [Dk, Dv] in registers for all rows of the chunk: thread
//    (j, part) owns column j, rows [part * Dk/4, (part + 1) * Dk/4); per row: l2norm of q and k, decay,
//    delta rule, readout, per-row state snapshot, gated RMSNorm. Sums over the key dim run in ascending
//    order inside a thread, then ((p0 + p1) + (p2 + p3)) across the four parts.
// Everything a row computes depends only on the state before it and its own inputs.
#include "puredrive/backend/cuda/common.cuh"

namespace pd::cuda {
namespace {

__global__ void gdn_conv_kernel(GdnLaunch g, int r0, int rows, float* conv_out) {
  pdl_enter();
  const int C = 2 * g.num_k_heads * g.k_head_dim + g.num_v_heads * g.v_head_dim;
  const int c = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= C) return;
  const int kc = g.conv_kernel;
  float win[kMaxConvKernel];
  float w[kMaxConvKernel];
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j) {
    win[j] = j < kc - 1 ? g.conv_state[static_cast<int64_t>(j) * C + c] : 0.0f;
    w[j] = j < kc ? g.conv1d[static_cast<int64_t>(c) * kc + j] : 0.0f;
  }
  for (int r = 0; r < rows; ++r) {
    const float x = g.qkv[static_cast<int64_t>(r0 + r) * g.qkv_stride + c];
#pragma unroll
    for (int j = 0; j < kMaxConvKernel; ++j) {
      if (j == kc - 1) win[j] = x;
    }
    float acc = w[0] * win[0];
#pragma unroll
    for (int j = 1; j < kMaxConvKernel; ++j) {
      if (j < kc) acc = acc + w[j] * win[j];
    }
    conv_out[static_cast<int64_t>(r) * C + c] = siluf_(acc);
#pragma unroll
    for (int j = 0; j + 1 < kMaxConvKernel; ++j) {
      if (j < kc - 1) win[j] = win[j + 1];  // drop the oldest input
    }
    if (g.snap_conv != nullptr) {
      float* snap = g.snap_conv + static_cast<int64_t>(r0 + r) * g.snap_conv_stride;
#pragma unroll
      for (int j = 0; j < kMaxConvKernel; ++j) {
        if (j < kc - 1) snap[static_cast<int64_t>(j) * C + c] = win[j];
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j) {
    if (j < kc - 1) g.conv_state[static_cast<int64_t>(j) * C + c] = win[j];
  }
}

// RPT = Dk / 4 state rows per thread; blockDim = 4 * Dv <= 512 (128 registers per thread keep S resident).
template <int RPT>
__global__ void __launch_bounds__(512)
    gdn_recurrent_kernel(GdnLaunch g, int r0, int rows, const float* conv_out) {
  pdl_enter();
  constexpr int kParts = 4;
  const int Dk = RPT * kParts;
  const int Dv = g.v_head_dim;
  __shared__ float qs[RPT * kParts], ks[RPT * kParts];
  __shared__ float red[32];
  const int h = static_cast<int>(blockIdx.x);
  const int kh = h / (g.num_v_heads / g.num_k_heads);
  const int tid = static_cast<int>(threadIdx.x);
  const int j = tid / kParts, part = tid % kParts;
  const int i0 = part * RPT;
  const int key_dim = g.num_k_heads * Dk;
  const int C = 2 * key_dim + g.num_v_heads * Dv;
  const int64_t head_size = static_cast<int64_t>(Dk) * Dv;
  float* state = g.recurrent + h * head_size;
  float s[RPT];
#pragma unroll
  for (int ii = 0; ii < RPT; ++ii) s[ii] = state[static_cast<int64_t>(i0 + ii) * Dv + j];
  const float neg_a = -expf(g.A_log[h]);
  const float dt_bias = g.dt_bias[h];
  const float q_scale = static_cast<float>(1.0 / sqrt(static_cast<double>(Dk)));
  for (int r = 0; r < rows; ++r) {
    const int64_t gr = r0 + r;
    const float* x = conv_out + static_cast<int64_t>(r) * C;
    // l2norm(q) * Dk^-1/2 and l2norm(k), eps 1e-6 inside the root (FLA / HF).
    const float qv = tid < Dk ? x[kh * Dk + tid] : 0.0f;
    const float kv = tid < Dk ? x[key_dim + kh * Dk + tid] : 0.0f;
    const float qn = block_sum(qv * qv, red);
    const float kn = block_sum(kv * kv, red);
    if (tid < Dk) {
      qs[tid] = (qv * (1.0f / sqrtf(qn + 1e-6f))) * q_scale;
      ks[tid] = kv * (1.0f / sqrtf(kn + 1e-6f));
    }
    __syncthreads();
    const float beta = sigmoidf_(g.b[gr * g.b_stride + h]);
    const float alpha = expf(neg_a * softplusf_(g.a[gr * g.a_stride + h] + dt_bias));
    const float v = x[2 * key_dim + static_cast<int64_t>(h) * Dv + j];
    // S *= alpha; kv = S^T k
    float kvp = 0.0f;
#pragma unroll
    for (int ii = 0; ii < RPT; ++ii) {
      s[ii] = s[ii] * alpha;
      kvp = fmaf(s[ii], ks[i0 + ii], kvp);
    }
    kvp += __shfl_xor_sync(0xffffffffu, kvp, 1);
    kvp += __shfl_xor_sync(0xffffffffu, kvp, 2);
    const float delta = (v - kvp) * beta;
    // S += k delta^T; o = S^T q
    float op = 0.0f;
#pragma unroll
    for (int ii = 0; ii < RPT; ++ii) {
      s[ii] = fmaf(ks[i0 + ii], delta, s[ii]);
      op = fmaf(s[ii], qs[i0 + ii], op);
    }
    op += __shfl_xor_sync(0xffffffffu, op, 1);
    op += __shfl_xor_sync(0xffffffffu, op, 2);
    if (g.snap_recurrent != nullptr) {
      float* snap = g.snap_recurrent + gr * g.snap_recurrent_stride + h * head_size;
#pragma unroll
      for (int ii = 0; ii < RPT; ++ii) snap[static_cast<int64_t>(i0 + ii) * Dv + j] = s[ii];
    }
    // Gated RMSNorm, norm before gate: (w * (o * rsqrt(mean(o^2) + eps))) * silu(z).
    const float on = block_sum(part == 0 ? op * op : 0.0f, red);
    if (part == 0) {
      const float inv = 1.0f / sqrtf(on / static_cast<float>(Dv) + g.eps);
      const float z = g.z[gr * g.z_stride + static_cast<int64_t>(h) * Dv + j];
      g.out[gr * g.out_stride + static_cast<int64_t>(h) * Dv + j] = (g.norm[j] * (op * inv)) * siluf_(z);
    }
  }
#pragma unroll
  for (int ii = 0; ii < RPT; ++ii) state[static_cast<int64_t>(i0 + ii) * Dv + j] = s[ii];
}

}  // namespace

int64_t gdn_scratch_floats(int channels) {
  return static_cast<int64_t>(kGdnChunk) * channels;
}

bool gdn_supported(int k_head_dim, int v_head_dim) {
  const bool dk_ok =
      k_head_dim == 16 || k_head_dim == 32 || k_head_dim == 64 || k_head_dim == 128 || k_head_dim == 256;
  return dk_ok && v_head_dim >= 8 && v_head_dim <= 128 && (4 * v_head_dim) % 32 == 0 &&
         k_head_dim <= 4 * v_head_dim;
}

void launch_gated_delta_net(const GdnLaunch& g, cudaStream_t stream) {
  const int C = 2 * g.num_k_heads * g.k_head_dim + g.num_v_heads * g.v_head_dim;
  float* conv_out = g.scratch;
  for (int r0 = 0; r0 < g.rows; r0 += kGdnChunk) {
    const int n = g.rows - r0 < kGdnChunk ? g.rows - r0 : kGdnChunk;
    launch_pdl(gdn_conv_kernel, dim3(grid_for(C, 128)), dim3(128), 0, stream, g, r0, n, conv_out);
    const unsigned threads = static_cast<unsigned>(4 * g.v_head_dim);
    switch (g.k_head_dim) {
      case 16:
        launch_pdl(gdn_recurrent_kernel<4>, dim3(g.num_v_heads), dim3(threads), 0, stream, g, r0, n,
                   static_cast<const float*>(conv_out));
        break;
      case 32:
        launch_pdl(gdn_recurrent_kernel<8>, dim3(g.num_v_heads), dim3(threads), 0, stream, g, r0, n,
                   static_cast<const float*>(conv_out));
        break;
      case 64:
        launch_pdl(gdn_recurrent_kernel<16>, dim3(g.num_v_heads), dim3(threads), 0, stream, g, r0, n,
                   static_cast<const float*>(conv_out));
        break;
      case 128:
        launch_pdl(gdn_recurrent_kernel<32>, dim3(g.num_v_heads), dim3(threads), 0, stream, g, r0, n,
                   static_cast<const float*>(conv_out));
        break;
      default:
        launch_pdl(gdn_recurrent_kernel<64>, dim3(g.num_v_heads), dim3(threads), 0, stream, g, r0, n,
                   static_cast<const float*>(conv_out));
        break;
    }
  }
}

}  // namespace pd::cuda
