// The prefix cache on the CUDA backend (docs/DESIGN.md §4.8), with the scenarios of the CPU test
// (tests/exactness/prefix_cache_scenarios.h) on every fixture: each request with the cache gives bitwise the
// tokens, MTP acceptance and state (KV rows, GDN states, the MTP head's rows) of the same request run cold on
// the GPU; the cache makes the same decisions as on the CPU backend (cached counts and statistics of the same
// scenario run there); blocks and snapshots move between GPU and host memory under small budgets and still
// resume exactly. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>

#include "cuda/cuda_test_util.h"
#include "exactness/prefix_cache_scenarios.h"
#include "golden/fixture_util.h"

namespace pd {
namespace {

struct Side {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<Generator> gen;
};

// A fixture's model on one backend with a generator whose prefill chunk is 128 rows and whose cache has the
// given budgets (mtp: when the generator drafts with the head).
Side open_side(const Checkpoint& ck, std::unique_ptr<Backend> backend, const PrefixCacheOptions& budgets) {
  Side s;
  s.backend = std::move(backend);
  Expected<std::unique_ptr<Model>> m = create_model(ck.config, ck.weights, *s.backend, {.max_rows = 128});
  PD_ASSERT(m.has_value(), "{}", m.status().to_string());
  s.model = std::move(*m);
  Expected<std::unique_ptr<Generator>> g =
      Generator::create(*s.model, {.ctx_size = 1024, .kv_dtype = DType::kBF16, .max_draft = 4, .mtp = true});
  PD_ASSERT(g.has_value(), "{}", g.status().to_string());
  s.gen = std::move(*g);
  const Status ok = s.gen->enable_prefix_cache(budgets);
  PD_ASSERT(ok.is_ok(), "{}", ok.to_string());
  return s;
}

std::unique_ptr<Backend> cpu() {
  return create_backend({.name = "cpu", .threads = 2}).value();
}

class CudaPrefixCache : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaPrefixCache, BranchesHitExactlyAndDecideAsOnTheCpu) {
  std::string skip;
  std::unique_ptr<Backend> gpu = cudatest::try_cuda(&skip);
  if (gpu == nullptr) GTEST_SKIP() << "no CUDA device: " << skip;
  Expected<Checkpoint> ck = load_checkpoint(golden::fixtures_dir() + "/" + GetParam());
  ASSERT_TRUE(ck.has_value()) << ck.status().to_string();
  const PrefixCacheOptions large{.device_budget = int64_t{256} << 20, .host_budget = 0, .mtp = false};
  Side g = open_side(*ck, std::move(gpu), large);
  const std::vector<int> on_gpu = test::branch_scenario(*g.gen, 5);
  EXPECT_EQ(on_gpu, test::branch_scenario_expected());
  Side c = open_side(*ck, cpu(), large);
  EXPECT_EQ(on_gpu, test::branch_scenario(*c.gen, 5)) << "cached counts on the CPU backend";
  const PrefixCacheStats &gs = g.gen->prefix_cache()->stats(), &cs = c.gen->prefix_cache()->stats();
  EXPECT_EQ(gs.blocks, cs.blocks);
  EXPECT_EQ(gs.snapshots, cs.snapshots);
  EXPECT_EQ(gs.device_bytes, cs.device_bytes);
  EXPECT_EQ(gs.hit_tokens, cs.hit_tokens);
}

TEST_P(CudaPrefixCache, EvictsToHostMemoryAndResumesExactly) {
  std::string skip;
  std::unique_ptr<Backend> gpu = cudatest::try_cuda(&skip);
  if (gpu == nullptr) GTEST_SKIP() << "no CUDA device: " << skip;
  Expected<Checkpoint> ck = load_checkpoint(golden::fixtures_dir() + "/" + GetParam());
  ASSERT_TRUE(ck.has_value()) << ck.status().to_string();
  Side probe = open_side(*ck, cpu(), {});
  const PrefixCacheOptions budgets = test::eviction_budgets(*probe.gen->prefix_cache());
  Side g = open_side(*ck, std::move(gpu), budgets);
  EXPECT_EQ(test::eviction_scenario(*g.gen, 3), test::eviction_scenario_expected());
  Side c = open_side(*ck, cpu(), budgets);
  test::eviction_scenario(*c.gen, 3);
  const PrefixCacheStats &gs = g.gen->prefix_cache()->stats(), &cs = c.gen->prefix_cache()->stats();
  EXPECT_EQ(gs.demotions, cs.demotions) << "the same payloads move on both backends";
  EXPECT_EQ(gs.evictions, cs.evictions);
  EXPECT_EQ(gs.host_bytes, cs.host_bytes);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaPrefixCache, ::testing::ValuesIn(golden::fixture_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string s = i.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace pd
