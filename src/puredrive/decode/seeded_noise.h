// Randomness for sampling, in two flavours.
//
// Rng: a stream generator (xoshiro256**, seeded through splitmix64) for the unseeded sampler and the
// token-wise / block acceptance tests. Its draws depend on how many came before.
//
// Seeded noise: a pure function of (seed, absolute position, token id), with no state at all. The seeded
// exact mode (docs/spec/speculative.md §2) draws the token at position n as argmax_v log p(v) + g(n, v) with
// Gumbel noise g = -log(-log u(seed, n, v)). Because the noise of a position does not depend on how the
// sequence got there, a speculative verify row and a one-row decode step at the same position see the
// same noise, and MTP on == MTP off token for token. The draft uses the same noise with its own
// distribution (Gumbel coupling), which keeps acceptance high.
//
// "Position" is the 0-based index of the token being produced in the whole sequence, prompt included.
#pragma once

#include <cmath>
#include <cstdint>

namespace pd {

// The splitmix64 output function (Steele, Lea, Flood 2014): a bijective 64-bit mixer.
constexpr uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// 52 random bits -> a double strictly inside (0, 1): (b + 0.5) / 2^52, from 2^-53 to 1 - 2^-53, all exact.
// Never 0 (so log(u) is finite and "r <= 0" never accepts a zero-probability token) and never 1 (53 bits
// would round the largest value up to 1).
constexpr double bits_to_open_unit(uint64_t bits) {
  return (static_cast<double>(bits >> 12) + 0.5) * 0x1.0p-52;
}

// Counter-based hash of (seed, position, token). Each field goes through the mixer on its own step so that
// neighbouring positions or tokens give unrelated outputs.
constexpr uint64_t noise_bits(uint64_t seed, int64_t position, int32_t token) {
  uint64_t h = splitmix64_mix(seed + 0x9e3779b97f4a7c15ULL);
  h = splitmix64_mix(h ^ (static_cast<uint64_t>(position) + 0x632be59bd9b4e019ULL));
  h = splitmix64_mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(token)) + 0x8cb92ba72f3d8dd7ULL));
  return h;
}

inline double noise_uniform(uint64_t seed, int64_t position, int32_t token) {
  return bits_to_open_unit(noise_bits(seed, position, token));
}

// Standard Gumbel: -log(-log u), u in (0, 1).
inline double gumbel_noise(uint64_t seed, int64_t position, int32_t token) {
  return -std::log(-std::log(noise_uniform(seed, position, token)));
}

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t z = seed;
    for (uint64_t& s : s_) {
      z += 0x9e3779b97f4a7c15ULL;
      s = splitmix64_mix(z);
    }
  }

  uint64_t next_u64() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in the open interval (0, 1).
  double uniform() { return bits_to_open_unit(next_u64()); }

 private:
  static constexpr uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace pd
