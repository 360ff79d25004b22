// Prefix-cache scenarios shared by the CPU test (tests/exactness/prefix_cache_test.cpp) and the CUDA test
// (tests/cuda/cuda_prefix_cache_test.cpp): requests sent through a generator with a prefix cache, each
// compared with the same request run cold (the cache bypassed) on the same generator. The output tokens, the
// MTP cycles' accepted counts and the state left behind (KV rows, GDN states, the MTP head's rows) must be
// bitwise the same (docs/DESIGN.md §4.8).
#pragma once

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "puredrive/decode/generator.h"

namespace pd::test {

struct CacheRun {
  std::vector<int32_t> tokens;
  std::vector<int> cycle_accepted;
  int cached = 0;
  std::vector<std::vector<uint8_t>> state;
};

// The committed state: KV rows [0, length) of every attention layer, GDN conv and recurrent states, and with
// mtp the MTP head's rows [0, mtp_length) (plain decoding without a cache never runs the head).
inline std::vector<std::vector<uint8_t>> state_bytes(Backend& be, const SequenceState& st, bool mtp) {
  auto bytes = [&](const Tensor& t, int64_t rows) {
    std::vector<uint8_t> v(static_cast<size_t>(rows * t.cols) * dtype_size(t.dtype));
    if (rows > 0) PD_ASSERT(be.download(v.data(), t.row_slice(0, rows)).is_ok());
    return v;
  };
  std::vector<std::vector<uint8_t>> out;
  const CacheSpec& spec = st.spec();
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    const int li = static_cast<int>(l);
    if (spec.layers[l] == LayerType::kFullAttention) {
      out.push_back(bytes(st.kv(li).k, st.length()));
      out.push_back(bytes(st.kv(li).v, st.length()));
    } else {
      out.push_back(bytes(st.gdn(li).conv, st.gdn(li).conv.rows));
      out.push_back(bytes(st.gdn(li).recurrent, st.gdn(li).recurrent.rows));
    }
  }
  for (int m = 0; mtp && m < spec.mtp_layers; ++m) {
    out.push_back(bytes(st.mtp_kv(m).k, st.mtp_length()));
    out.push_back(bytes(st.mtp_kv(m).v, st.mtp_length()));
  }
  return out;
}

struct CacheRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;  // default: greedy
  int num_draft = 2;
  int max_tokens = 24;
};

inline SamplingParams greedy_params() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

inline CacheRun run_request(Generator& g, const CacheRequest& c, bool use_cache) {
  DecodeRequest r;
  r.prompt = c.prompt;
  r.sampling = c.sampling;
  r.num_draft = g.has_drafter() ? c.num_draft : 0;
  r.max_tokens = c.max_tokens;
  r.prefix_cache = use_cache;
  Expected<DecodeResult> out = g.generate(r);
  PD_ASSERT(out.has_value(), "{}", out.status().to_string());
  return {.tokens = out->tokens,
          .cycle_accepted = out->cycle_accepted,
          .cached = out->cached_tokens,
          .state = state_bytes(g.model().backend(), g.state(), r.num_draft > 0)};
}

// Sends c with the cache, then cold, and expects the same bits; returns the run with the cache.
inline CacheRun exact_run(Generator& g, const CacheRequest& c) {
  const CacheRun hit = run_request(g, c, true);
  const CacheRun cold = run_request(g, c, false);
  EXPECT_EQ(cold.cached, 0);
  EXPECT_EQ(hit.tokens, cold.tokens) << "output with " << hit.cached << " cached tokens";
  EXPECT_EQ(hit.cycle_accepted, cold.cycle_accepted) << "MTP acceptance with " << hit.cached << " cached";
  EXPECT_EQ(hit.state.size(), cold.state.size());
  for (size_t t = 0; t < hit.state.size() && t < cold.state.size(); ++t) {
    EXPECT_TRUE(hit.state[t] == cold.state[t])
        << "state tensor " << t << " (per layer K, V or conv, "
        << "recurrent; then the MTP head's K, V) after a hit of " << hit.cached;
  }
  const Status ok = g.prefix_cache()->check();
  EXPECT_TRUE(ok.is_ok()) << ok.to_string();
  return hit;
}

// The cached token count of exact_run().
inline int expect_exact_hit(Generator& g, const CacheRequest& c) {
  return exact_run(g, c).cached;
}

inline std::vector<int32_t> random_tokens(int vocab, int n, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& t : v) t = d(rng);
  return v;
}

inline std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

inline std::vector<int32_t> first(const std::vector<int32_t>& a, size_t n) {
  return {a.begin(), a.begin() + static_cast<std::ptrdiff_t>(n)};
}

// Hits at block boundaries, a prefix that ends inside a block, and divergent branches, on a generator whose
// prefill chunk is 128 rows and whose cache is empty and large. Expected cached counts follow from the rules
// of generator.h: snapshots at chunk ends (multiples of 128 from where the prefill started), at the block
// where a prompt leaves the cached chain, and at a prompt's last block boundary (of its first L - 1 tokens).
// Returns the cached counts, in order.
inline std::vector<int> branch_scenario(Generator& g, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const int V = g.vocab_size();
  const std::vector<int32_t> a = random_tokens(V, 300, rng);
  const std::vector<int32_t> b = concat(first(a, 257), random_tokens(V, 100, rng));
  const std::vector<int32_t> c = concat(first(a, 100), random_tokens(V, 150, rng));
  const std::vector<int32_t> d = concat(first(a, 100), random_tokens(V, 120, rng));
  const std::vector<int32_t> e = concat(first(b, 300), random_tokens(V, 40, rng));
  SamplingParams seeded;
  seeded.temperature = 0.8f;
  seeded.top_p = 0.95f;
  seeded.seed = seed;
  std::vector<int> cached;
  // a: cold; snapshots at 128 and 256 (its last boundary: 299 -> 256).
  cached.push_back(expect_exact_hit(g, {.prompt = a, .sampling = greedy_params()}));
  // a again, greedy then seeded then plain decoding: resumes at 256.
  cached.push_back(expect_exact_hit(g, {.prompt = a, .sampling = greedy_params()}));
  cached.push_back(expect_exact_hit(g, {.prompt = a, .sampling = seeded}));
  cached.push_back(expect_exact_hit(g, {.prompt = a, .sampling = greedy_params(), .num_draft = 0}));
  // b shares a's first 257 tokens: resumes at 256; snapshot at 320 (its last boundary).
  cached.push_back(expect_exact_hit(g, {.prompt = b, .sampling = seeded}));
  // c shares 100 tokens (one block and part of the next): block 0 matches but has no snapshot, so nothing
  // is restored; c stores one at 64, where it left the chain, and at 192 (a chunk end and its last
  // boundary).
  cached.push_back(expect_exact_hit(g, {.prompt = c, .sampling = greedy_params()}));
  // d shares the same 100 tokens: resumes at c's snapshot, 64.
  cached.push_back(expect_exact_hit(g, {.prompt = d, .sampling = greedy_params()}));
  // e follows b for 300 tokens: b's block 4 (256..320) differs, so 256.
  cached.push_back(expect_exact_hit(g, {.prompt = e, .sampling = greedy_params()}));
  // c again: its own branch, 192.
  cached.push_back(expect_exact_hit(g, {.prompt = c, .sampling = seeded}));
  return cached;
}

inline const std::vector<int>& branch_scenario_expected() {
  static const std::vector<int> v = {0, 256, 256, 256, 256, 0, 64, 256, 192};
  return v;
}

// Budgets of a device tier that holds one 300-token prompt (4 blocks, snapshots at 128 and 256) and a host
// tier that holds two.
inline PrefixCacheOptions eviction_budgets(const PrefixCache& probe) {
  const int64_t b = probe.block_bytes(), s = probe.snapshot_bytes();
  return {.device_budget = 4 * b + 2 * s, .host_budget = 8 * b + 4 * s, .mtp = false};
}

// Six 300-token prompts through the budgets of eviction_budgets(): the newest prompt stays on the device, the
// two before it move to host memory and still resume exactly, older ones are gone. Returns the cached counts
// of the prompts sent again (5, 4, 3, 0).
inline std::vector<int> eviction_scenario(Generator& g, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(random_tokens(g.vocab_size(), 300, rng));
    EXPECT_EQ(expect_exact_hit(g, {.prompt = prompts.back(), .sampling = greedy_params()}), 0);
  }
  const PrefixCacheStats& s = g.prefix_cache()->stats();
  EXPECT_GT(s.demotions, 0);
  EXPECT_GT(s.evictions, 0);
  EXPECT_GT(s.host_bytes, 0);
  std::vector<int> cached;
  const int64_t demoted = s.demotions;
  for (const int i : {5, 4, 3, 0}) {
    cached.push_back(
        expect_exact_hit(g, {.prompt = prompts[static_cast<size_t>(i)], .sampling = greedy_params()}));
    if (i == 3) {
      EXPECT_EQ(s.demotions, demoted) << "restoring moves nothing";
    }
  }
  return cached;
}

inline const std::vector<int>& eviction_scenario_expected() {
  static const std::vector<int> v = {256, 256, 256, 0};  // device, host, host, evicted
  return v;
}

}  // namespace pd::test
