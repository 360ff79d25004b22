// What the CPU kernels' files share about the instruction set: whether the AVX2 + FMA paths run (decided
// once, at start-up), and the one fixed tree that sums an AVX2 dot's four accumulators, so that every dot
// keeps the canonical order's bits (kernels.h).
#pragma once

#include <immintrin.h>

#if defined(__x86_64__) || defined(__i386__)
#define PD_X86 1
#else
#define PD_X86 0
#endif

namespace pd::cpu::simd {

#if PD_X86
inline bool detect_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}
inline const bool kHasAvx2 = detect_avx2();

// The sum of four accumulators of eight lanes in one fixed tree, shared by every AVX2 dot so that their
// results keep the same bits.
__attribute__((target("avx2,fma"))) inline float hsum_canonical(const __m256* acc) {
  const __m256 t = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}
#else
inline constexpr bool kHasAvx2 = false;
#endif

}  // namespace pd::cpu::simd
