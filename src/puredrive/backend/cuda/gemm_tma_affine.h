// The affine weights' side of the wgmma prefill products (gemm_tma_affine.cu), dispatched from gemm_tma.cu's
// entry points (kernels.h, "Tensor-core products for prefill").
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "puredrive/backend/cuda/kernels.h"

namespace pd::cuda {

// Jobs whose every matrix is affine with codes the copy engine can read in 64-column boxes (2, 4, 6 or 8
// bits, rows of a multiple of 16 bytes, 16-byte aligned data) and one width for all; PD_AFFINE_TMA=0 leaves
// them to the mma.sync kernel (kernels.h).
bool affine_tma_job(const MmaJob& j);
// Scratch of a part of `rows` activation rows and K columns (affine_tma_job's jobs need at most this).
int64_t affine_tma_part_bytes(int64_t rows, int64_t K);
int64_t affine_tma_scratch_bytes(const MmaJob& j, int m_tiles);
void launch_affine_tma(const MmaJob& j, int m_tiles, void* scratch, cudaStream_t stream);
// The kernels' shared-memory opt-in; false where refused.
bool opt_in_affine_tma();

}  // namespace pd::cuda
