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
// "Position" is the 0-based index of the token being produced in the whole sequence, prompt included. The
// noise functions live in backend/sampling_math.h, where the host and the device share them.
#pragma once

#include <cstdint>

#include "puredrive/backend/sampling_math.h"  // splitmix64_mix, noise_bits, noise_uniform, gumbel_noise

namespace pd {

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
