// The scalar math of sampling, written once for the host and the device so that the CPU sampler and the
// CUDA sample op agree bit for bit (backend.h SampleArgs, docs/spec/speculative.md §4).
//
// Bitwise agreement needs every floating-point result to come from the same sequence of correctly rounded
// IEEE operations on both sides:
// - exp and log are our own (det_exp, det_log): range reduction and a polynomial in +, -, *, / only, since
//   the C library's and CUDA's versions differ in the last bits. Error about 1 ulp.
// - No FMA contraction: the host libraries that include this header are built with -ffp-contract=off and
//   the CUDA ones with --fmad=false (src/CMakeLists.txt).
// - Sums over the vocabulary are exact: each weight in [0, 2^21) becomes the integer floor(w * 2^106)
//   (U128), and integer addition does not care about order, so a GPU reduction tree and a CPU loop give the
//   same total. 2^106 leaves room for 2^20 tokens of weight <= 1 below 2^127 and keeps every weight above
//   2^-54 exact; weights below 2^-106 become 0 and count as masked.
//
// Also here: the counter-based noise of the seeded mode (a pure function of seed, position and token) and
// the penalty of one logit, which the host and the device evaluate alike.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define PD_HD __host__ __device__ inline
#else
#define PD_HD inline
#endif

namespace pd {

PD_HD uint64_t double_bits(double x) {
#ifdef __CUDA_ARCH__
  return static_cast<uint64_t>(__double_as_longlong(x));
#else
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
#endif
}

PD_HD double double_from_bits(uint64_t b) {
#ifdef __CUDA_ARCH__
  return __longlong_as_double(static_cast<long long>(b));
#else
  double x;
  std::memcpy(&x, &b, sizeof x);
  return x;
#endif
}

PD_HD uint32_t float_bits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
#endif
}

PD_HD float float_from_bits(uint32_t b) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(b);
#else
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
#endif
}

PD_HD double pd_floor(double x) {
#ifdef __CUDA_ARCH__
  return floor(x);
#else
  return std::floor(x);
#endif
}

PD_HD double infinity_d() {
  return double_from_bits(0x7ff0000000000000ULL);
}

// 2^k for -1022 <= k <= 1023, exactly.
PD_HD double pow2(int k) {
  return double_from_bits(static_cast<uint64_t>(k + 1023) << 52);
}

// e^x, within about 1 ulp, the same bits on every device. x = k ln2 + r with |r| <= ln2 / 2 (Cody-Waite:
// k * kLn2Hi is exact), e^r by its Taylor series to r^13 (truncation below 2^-57), then scaled by 2^k.
PD_HD double det_exp(double x) {
  if (x != x) return x;
  if (x > 709.78) return infinity_d();
  if (x < -745.2) return 0.0;
  constexpr double kInvLn2 = 0x1.71547652b82fep+0;
  constexpr double kLn2Hi = 0x1.62e42fee00000p-1;  // 32 significant bits
  constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;
  const double kf = pd_floor(x * kInvLn2 + 0.5);
  const double r = (x - kf * kLn2Hi) - kf * kLn2Lo;
  // Horner with c_n = 1/n!, correctly rounded.
  double p = 0x1.6124613a86d09p-33;
  p = p * r + 0x1.1eed8eff8d898p-29;
  p = p * r + 0x1.ae64567f544e4p-26;
  p = p * r + 0x1.27e4fb7789f5cp-22;
  p = p * r + 0x1.71de3a556c734p-19;
  p = p * r + 0x1.a01a01a01a01ap-16;
  p = p * r + 0x1.a01a01a01a01ap-13;
  p = p * r + 0x1.6c16c16c16c17p-10;
  p = p * r + 0x1.1111111111111p-7;
  p = p * r + 0x1.5555555555555p-5;
  p = p * r + 0x1.5555555555555p-3;
  p = p * r + 0x1.0000000000000p-1;
  p = p * r + 1.0;
  p = p * r + 1.0;
  const int k = static_cast<int>(kf);
  if (k > 1023) return p * pow2(1023) * 2.0;
  if (k < -1022) return p * pow2(k + 54) * 0x1.0p-54;  // one rounding into the subnormals
  return p * pow2(k);
}

// Natural log, within about 1 ulp, the same bits on every device. x = m 2^e with m in (sqrt(1/2), sqrt(2)],
// log m = 2 atanh(s) with s = (m - 1) / (m + 1), |s| <= 0.1716, by its odd series to s^23.
PD_HD double det_log(double x) {
  if (x != x || x < 0.0) return double_from_bits(0x7ff8000000000000ULL);
  if (x == 0.0) return -infinity_d();
  if (x == infinity_d()) return x;
  int e = 0;
  if (x < 0x1.0p-1022) {  // subnormal: make it normal first
    x *= 0x1.0p+54;
    e = -54;
  }
  const uint64_t b = double_bits(x);
  e += static_cast<int>(b >> 52) - 1023;
  double m = double_from_bits((b & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL);  // [1, 2)
  if (m > 0x1.6a09e667f3bcdp+0) {
    m *= 0.5;
    ++e;
  }
  const double f = m - 1.0;  // exact
  const double s = f / (2.0 + f);
  const double z = s * s;
  // Horner with 1/3, 1/5, ..., 1/23, correctly rounded.
  double q = 0x1.642c8590b2164p-5;
  q = q * z + 0x1.8618618618618p-5;
  q = q * z + 0x1.af286bca1af28p-5;
  q = q * z + 0x1.e1e1e1e1e1e1ep-5;
  q = q * z + 0x1.1111111111111p-4;
  q = q * z + 0x1.3b13b13b13b14p-4;
  q = q * z + 0x1.745d1745d1746p-4;
  q = q * z + 0x1.c71c71c71c71cp-4;
  q = q * z + 0x1.2492492492492p-3;
  q = q * z + 0x1.999999999999ap-3;
  q = q * z + 0x1.5555555555555p-2;
  const double log_m = 2.0 * s + 2.0 * (s * (z * q));
  constexpr double kLn2Hi = 0x1.62e42fee00000p-1;
  constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;
  const double de = static_cast<double>(e);
  return de * kLn2Hi + (log_m + de * kLn2Lo);
}

// ---- Exact sums: unsigned 128-bit fixed point ----

// Trivial (no member initializers) so that it can live in CUDA shared memory: write U128{} for zero.
struct U128 {
  uint64_t lo;
  uint64_t hi;
};

PD_HD U128 add(U128 a, U128 b) {
  U128 r{};
  r.lo = a.lo + b.lo;
  r.hi = a.hi + b.hi + (r.lo < a.lo ? 1u : 0u);
  return r;
}
PD_HD U128 sub(U128 a, U128 b) {  // a >= b
  U128 r{};
  r.lo = a.lo - b.lo;
  r.hi = a.hi - b.hi - (a.lo < b.lo ? 1u : 0u);
  return r;
}
PD_HD bool less(U128 a, U128 b) {
  return a.hi < b.hi || (a.hi == b.hi && a.lo < b.lo);
}
PD_HD bool is_zero(U128 a) {
  return (a.lo | a.hi) == 0;
}

// The nearest double, through two roundings (the same two everywhere); monotone in the value.
PD_HD double to_double(U128 a) {
  return static_cast<double>(a.hi) * 0x1.0p+64 + static_cast<double>(a.lo);
}

constexpr int kFixedShift = 106;
constexpr double kFixedUnit = 0x1.0p-106;  // the weight of one unit
constexpr double kMinWeight = 0x1.0p-106;  // smaller weights are 0 in fixed point: masked

// floor(w * 2^106) for w in [0, 2^21).
PD_HD U128 to_fixed(double w) {
  U128 r{};
  if (!(w >= kMinWeight)) return r;
  const uint64_t b = double_bits(w);
  const int e = static_cast<int>(b >> 52);
  const uint64_t mant = (b & 0x000fffffffffffffULL) | 0x0010000000000000ULL;
  const int shift = e - 1075 + kFixedShift;  // value = mant * 2^shift
  if (shift >= 0) {
    if (shift >= 64) {
      r.hi = mant << (shift - 64);
    } else {
      r.lo = mant << shift;
      r.hi = shift == 0 ? 0 : mant >> (64 - shift);
    }
  } else {
    r.lo = mant >> -shift;  // -shift <= 52
  }
  return r;
}

PD_HD uint64_t mul_hi64(uint64_t a, uint64_t b) {
#ifdef __CUDA_ARCH__
  return __umul64hi(a, b);
#else
  __extension__ typedef unsigned __int128 u128_t;
  return static_cast<uint64_t>((static_cast<u128_t>(a) * b) >> 64);
#endif
}

// floor(m * u / 2^64), exact; m < 2^127.
PD_HD U128 mul_frac(U128 m, uint64_t u) {
  const uint64_t lo_hi = mul_hi64(m.lo, u);  // (m.lo * u) >> 64
  U128 r{};
  r.lo = m.hi * u + lo_hi;
  r.hi = mul_hi64(m.hi, u) + (r.lo < lo_hi ? 1u : 0u);
  return r;
}

// A uniform u in (0, 1) of the 52-bit grid of bits_to_open_unit as a 64-bit fraction: u * 2^64 exactly.
PD_HD uint64_t unit_fraction(double u) {
  return static_cast<uint64_t>(u * 0x1.0p+64);
}

// ---- Seeded noise (docs/spec/speculative.md §2) ----

// The splitmix64 output function (Steele, Lea, Flood 2014): a bijective 64-bit mixer.
PD_HD constexpr uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// 52 random bits -> a double strictly inside (0, 1): (b + 0.5) / 2^52, from 2^-53 to 1 - 2^-53, all exact.
// Never 0 (so log(u) is finite and "r <= 0" never accepts a zero-probability token) and never 1 (53 bits
// would round the largest value up to 1).
PD_HD constexpr double bits_to_open_unit(uint64_t bits) {
  return (static_cast<double>(bits >> 12) + 0.5) * 0x1.0p-52;
}

// Counter-based hash of (seed, position, token). Each field goes through the mixer on its own step so that
// neighbouring positions or tokens give unrelated outputs.
PD_HD constexpr uint64_t noise_bits(uint64_t seed, int64_t position, int32_t token) {
  uint64_t h = splitmix64_mix(seed + 0x9e3779b97f4a7c15ULL);
  h = splitmix64_mix(h ^ (static_cast<uint64_t>(position) + 0x632be59bd9b4e019ULL));
  h = splitmix64_mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(token)) + 0x8cb92ba72f3d8dd7ULL));
  return h;
}

PD_HD double noise_uniform(uint64_t seed, int64_t position, int32_t token) {
  return bits_to_open_unit(noise_bits(seed, position, token));
}

// Standard Gumbel: -log(-log u), u in (0, 1).
PD_HD double gumbel_noise(uint64_t seed, int64_t position, int32_t token) {
  return -det_log(-det_log(noise_uniform(seed, position, token)));
}

// ---- One logit ----

// Repetition penalty (HF/CTRL) for a token of the prompt or the output, then frequency (per count) and
// presence penalties (OpenAI) for output tokens; `seen` = in the prompt or count > 0.
PD_HD float penalised_logit(float v, bool seen, int32_t count, float repetition, float frequency,
                            float presence) {
  if (!seen) return v;
  if (repetition != 1.0f) v = v > 0.0f ? v / repetition : v * repetition;
  if (count > 0) {
    v -= frequency * static_cast<float>(count);
    v -= presence;
  }
  return v;
}

// The processed weight of a logit: exp((z - z_max) / T), the argmax exactly 1.
PD_HD double logit_weight(float z, double z_max, double temperature) {
  return det_exp((static_cast<double>(z) - z_max) / temperature);
}

}  // namespace pd
