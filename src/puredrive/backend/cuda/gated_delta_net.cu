// Gated DeltaNet after the input projections (backend.h GatedDeltaNetArgs; spec §5), rows in order, per chunk
// of up to kGdnChunk rows:
// 1. conv: one thread per channel carries the Kc-1 window through the rows (causal depthwise conv + SiLU),
//    writing the per-row conv snapshots and the final window;
// 2. recurrence (gdn_recurrent.cu): a cluster of blocks per value head keeps S_h [Dk, Dv] in registers for
//    all rows of the chunk; per row: l2norm of q and k, decay, delta rule, readout, per-row state snapshot;
//    then the gated RMSNorm of every row.
// Everything a row computes depends only on the state before it and its own inputs.
#include "puredrive/backend/cuda/common.cuh"
#include "puredrive/backend/cuda/trace.cuh"

namespace pd::cuda {
namespace {

__global__ void gdn_conv_kernel(GdnLaunch g, int r0, int rows, float* conv_out) {
  PD_TRACE_SCOPE(kGdnConv, rows);
  pdl_enter();
  PD_TRACE_STAMP(0);
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
    PD_TRACE_ENSURE();
    launch_pdl(gdn_conv_kernel, dim3(grid_for(C, 128)), dim3(128), 0, stream, g, r0, n, conv_out);
    launch_gdn_recurrent(g, r0, n, conv_out, stream);
  }
}

}  // namespace pd::cuda
