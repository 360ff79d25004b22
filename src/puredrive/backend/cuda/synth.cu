// Synthetic weights generated in device memory (formulas in synth_rng.h, shared with the host).
#include "puredrive/backend/cuda/common.cuh"
#include "puredrive/backend/cuda/synth_rng.h"

namespace pd::cuda {
namespace {

// Element i of a dense f32 / f16 / bf16 array (the counterpart of common.cuh scale_at).
__device__ __forceinline__ void store_at(void* dst, SDType t, int64_t i, float v) {
  switch (t) {
    case SDType::kF32:
      static_cast<float*>(dst)[i] = v;
      break;
    case SDType::kF16:
      static_cast<__half*>(dst)[i] = __float2half_rn(v);
      break;
    default:
      static_cast<uint16_t*>(dst)[i] = to_bf16_bits(v);
      break;
  }
}

__global__ void synth_dense_kernel(void* dst, SDType dtype, int64_t count, uint64_t seed, float amplitude) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    store_at(dst, dtype, i, synth::dense_value(seed, amplitude, static_cast<uint64_t>(i)));
  }
}

__global__ void synth_words_kernel(uint32_t* dst, int64_t count, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = synth::affine_word(seed, static_cast<uint64_t>(i));
  }
}

__global__ void fill_scalar_kernel(void* dst, SDType dtype, int64_t count, float value) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    store_at(dst, dtype, i, value);
  }
}

unsigned fill_blocks(int64_t count) {
  const unsigned b = grid_for(count, kBlock);
  return b < 65536 ? (b == 0 ? 1 : b) : 65536;
}

}  // namespace

void launch_synth_dense(void* dst, WFmt fmt, int64_t count, uint64_t seed, float amplitude,
                        cudaStream_t stream) {
  // Dense formats only: their elements are f32, f16 or bf16.
  const SDType dtype = fmt == WFmt::kF32 ? SDType::kF32 : fmt == WFmt::kF16 ? SDType::kF16 : SDType::kBF16;
  synth_dense_kernel<<<fill_blocks(count), kBlock, 0, stream>>>(dst, dtype, count, seed, amplitude);
}

void launch_synth_words(uint32_t* dst, int64_t count, uint64_t seed, cudaStream_t stream) {
  synth_words_kernel<<<fill_blocks(count), kBlock, 0, stream>>>(dst, count, seed);
}

void launch_fill_scalar(void* dst, SDType dtype, int64_t count, float value, cudaStream_t stream) {
  fill_scalar_kernel<<<fill_blocks(count), kBlock, 0, stream>>>(dst, dtype, count, value);
}

}  // namespace pd::cuda
