// Tensor-core matrix-vector products of bf16 weights for steps of up to kMaxRows rows (gemv_mma.cu).
#pragma once

#include <cuda_runtime.h>

#include "puredrive/backend/cuda/kernels.h"

namespace pd::cuda {

constexpr int kTileN = 16;  // weight rows per tile (the mma's M)

// The tiles of a launch: one matrix, or several stacked ones of one width (gemv_multi).
struct MmaTargets {
  DevMatrix m[kMaxMulti];
  float* out[kMaxMulti] = {};
  int64_t os[kMaxMulti] = {};
  int64_t tile_end[kMaxMulti] = {};  // cumulative 16-row tiles
  int count = 0;
  int accumulate = 0;
  // An input norm fused into the streamed kernels (InputNorm; launch_gemv_stream only): the products read
  // rms_norm(x) with this weight [cols] (16-byte aligned) and eps, bit for bit as rms_norm_kernel writes it.
  const float* norm = nullptr;
  float norm_eps = 0.0f;
  // Affine streamed kernels: tiles multiplied between two exchanges of the warps' partials, 1 or
  // kTilesPerSync (launch_gemv_stream sets it; PD_STREAM_PAIRS=0: 1).
  int tiles_per_sync = 1;
  // Streamed kernels: the weight copies' L2 policy is evict-first (stream_ring.cuh; PD_L2_EVICT_FIRST=0: the
  // default policy).
  int evict_first = 0;
};

// Whether launch_gemv routes m to the tensor-core kernels: bf16 weights whose width is a multiple of 64, or
// affine weights the streamed kernel takes (PD_GEMV_MMA=0 turns it off, for comparing with the CUDA-core
// kernels). The choice depends on the matrix only, never on the step's rows, so verify rows stay bitwise
// equal to one-row steps.
bool gemv_mma_supported(const DevMatrix& m);
// The same for every matrix of a stacked launch.
bool gemv_multi_mma_supported(const GemvMulti& g);
// rows <= kMaxRows; the arguments as launch_gemv and launch_gemv_multi take them.
void launch_gemv_mma(const DevMatrix& w, const float* x, int64_t x_stride, float* out, int64_t out_stride,
                     int rows, bool accumulate, cudaStream_t stream);
void launch_gemv_multi_mma(const GemvMulti& g, const float* x, int64_t x_stride, int rows,
                           cudaStream_t stream);

// The streamed variant (gemv_stream.cu): whether it takes m (bf16 or affine 4-, 6- or 8-bit with groups of
// 32-128 and bf16 or f16 scales, width 512, 1024, 2048 or 4096, 16-byte aligned rows; PD_GEMV_STREAM=0 turns
// it off, PD_AFFINE_STREAM=0 only for affine matrices), whether two matrices can share a launch, and the
// launch.
bool gemv_stream_supported(const DevMatrix& m);
bool gemv_stream_compatible(const DevMatrix& a, const DevMatrix& b);
void launch_gemv_stream(const MmaTargets& t, const float* x, int64_t x_stride, int rows, cudaStream_t stream);

}  // namespace pd::cuda
