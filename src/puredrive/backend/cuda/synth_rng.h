// The counter-based generator behind synthetic weights (`puredrive synth`, `bench --synth`). Every value is a
// pure function of (seed, index), written so that host and device produce the same bits: the CLI can
// materialise a small synthetic model in host memory for the CPU backend while the CUDA backend generates the
// same tensors directly in device memory.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define PD_SYNTH_FN __host__ __device__ __forceinline__
#else
#define PD_SYNTH_FN inline
#endif

namespace pd::synth {

// splitmix64's finaliser.
PD_SYNTH_FN uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

PD_SYNTH_FN uint32_t hash32(uint64_t seed, uint64_t i) {
  return static_cast<uint32_t>(mix64(seed ^ mix64(i)) >> 32);
}

// Uniform in [-1, 1): an int32 converted (round to nearest even on host and device) and scaled by 2^-31
// (exact).
PD_SYNTH_FN float uniform(uint64_t seed, uint64_t i) {
  return static_cast<float>(static_cast<int32_t>(hash32(seed, i))) * 4.656612873077393e-10f;
}

// Seed of one named tensor: FNV-1a of the name mixed with the model seed.
inline uint64_t tensor_seed(uint64_t model_seed, const char* name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char* p = name; *p != 0; ++p) h = (h ^ static_cast<uint8_t>(*p)) * 0x100000001b3ull;
  return mix64(h ^ mix64(model_seed));
}

// Dense weights: amplitude * U[-1, 1), rounded once to the storage format.
PD_SYNTH_FN float dense_value(uint64_t seed, float amplitude, uint64_t i) {
  return amplitude * uniform(seed, i);
}
// MLX affine weights: uniformly random code words; one scale and bias for every group, so that
// w = scale * q + bias spans [-amplitude, amplitude].
PD_SYNTH_FN uint32_t affine_word(uint64_t seed, uint64_t i) {
  return hash32(seed, i);
}
PD_SYNTH_FN float affine_scale(float amplitude, int bits) {
  return 2.0f * amplitude / static_cast<float>((1u << bits) - 1u);
}
PD_SYNTH_FN float affine_bias(float amplitude) {
  return -amplitude;
}

}  // namespace pd::synth
