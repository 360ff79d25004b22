// The prefix cache on the CPU backend (docs/DESIGN.md §4.8): every request with the cache gives bitwise the
// output, MTP acceptance and state of the same request run cold, for hits at block boundaries, prefixes that
// end inside a block, divergent branches, payloads restored from host memory after eviction from the device
// tier, and a long agent-like replay whose memory stays within its budgets. Bad input is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "exactness/counting_backend.h"
#include "exactness/generator_test_util.h"
#include "exactness/prefix_cache_scenarios.h"

namespace pd {
namespace {

using test::CacheRequest;
using test::expect_exact_hit;

struct CacheFixture {
  std::unique_ptr<golden::Fixture> fx;
  std::unique_ptr<Generator> gen;
  PrefixCache& cache() const { return *gen->prefix_cache(); }
};

// Prefill chunks of 128 rows; BF16 KV as `serve` keeps it.
std::unique_ptr<CacheFixture> open_cached(const std::string& name, PrefixCacheOptions budgets,
                                          int ctx = 1024) {
  auto c = std::make_unique<CacheFixture>();
  Expected<std::unique_ptr<golden::Fixture>> fx = golden::Fixture::open(name, 1, 128);
  PD_ASSERT(fx.has_value(), "{}", fx.status().to_string());
  c->fx = std::move(*fx);
  Expected<std::unique_ptr<Generator>> gen = Generator::create(
      *c->fx->model, {.ctx_size = ctx, .kv_dtype = DType::kBF16, .max_draft = 4, .mtp = true});
  PD_ASSERT(gen.has_value(), "{}", gen.status().to_string());
  c->gen = std::move(*gen);
  const Status s = c->gen->enable_prefix_cache(budgets);
  PD_ASSERT(s.is_ok(), "{}", s.to_string());
  return c;
}

constexpr PrefixCacheOptions kLarge{.device_budget = int64_t{256} << 20, .host_budget = 0, .mtp = false};

class PrefixCacheFixtures : public ::testing::TestWithParam<std::string> {};

TEST_P(PrefixCacheFixtures, HitsOnBranchesAreExact) {
  // The sanitizer run keeps one fixture with an MTP head and one without.
  if (!exactness::kFullSize && GetParam() != "qwen35-text-f32" && GetParam() != "qwen3next-f32") {
    GTEST_SKIP() << "full-size run only";
  }
  std::unique_ptr<CacheFixture> c = open_cached(GetParam(), kLarge);
  const std::vector<int> cached = test::branch_scenario(*c->gen, 5);
  const std::vector<int>& want = test::branch_scenario_expected();
  EXPECT_EQ(cached, want);
  const PrefixCacheStats& s = c->cache().stats();
  EXPECT_EQ(s.lookups, static_cast<int64_t>(want.size()));
  EXPECT_EQ(s.hits, std::count_if(want.begin(), want.end(), [](int n) { return n > 0; }));
  EXPECT_EQ(s.hit_tokens, std::accumulate(want.begin(), want.end(), int64_t{0}));
  EXPECT_EQ(s.evictions, 0);
  EXPECT_EQ(s.host_bytes, 0);
  EXPECT_EQ(s.device_bytes, s.blocks * c->cache().block_bytes() + s.snapshots * c->cache().snapshot_bytes());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PrefixCacheFixtures, ::testing::ValuesIn(golden::fixture_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string s = i.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

// Budgets in units of one block and one snapshot of this fixture.
PrefixCacheOptions budgets(const std::string& fixture, int device_blocks, int device_snapshots,
                           int host_blocks, int host_snapshots) {
  std::unique_ptr<CacheFixture> probe = open_cached(fixture, {});
  const int64_t b = probe->cache().block_bytes(), s = probe->cache().snapshot_bytes();
  return {.device_budget = device_blocks * b + device_snapshots * s,
          .host_budget = host_blocks * b + host_snapshots * s,
          .mtp = false};
}

// The newest prompt resumes from the device tier, the two before it from host memory, the oldest not at all.
TEST(PrefixCache, EvictsUnderBudgetsAndResumesFromHostMemory) {
  const std::string fixture = "qwen35-text-f32";
  std::unique_ptr<CacheFixture> c =
      open_cached(fixture, test::eviction_budgets(open_cached(fixture, {})->cache()));
  EXPECT_EQ(test::eviction_scenario(*c->gen, 3), test::eviction_scenario_expected());
}

// An agent-like conversation: every turn resends the previous prompt, the model's answer and new tokens.
// Every turn after the first resumes at the previous prompt's last block boundary, and with budgets smaller
// than what the conversation stores, the cache evicts and stays within them (check() after every request).
TEST(PrefixCache, LongReplayResumesEveryTurnWithinBudgets) {
  const std::string fixture = "qwen35-text-f32";
  std::unique_ptr<CacheFixture> c = open_cached(fixture, budgets(fixture, 4, 1, 20, 1), 2048);
  std::mt19937 rng(9);
  std::vector<int32_t> prompt = test::random_tokens(c->gen->vocab_size(), 200, rng);
  std::vector<int32_t> previous;
  const int turns = 12;
  for (int turn = 0; turn < turns; ++turn) {
    SCOPED_TRACE(fmt::format("turn {} ({} tokens)", turn, prompt.size()));
    const int want =
        previous.empty() ? 0 : (static_cast<int>(previous.size()) - 1) / kPrefixBlock * kPrefixBlock;
    const CacheRequest r{
        .prompt = prompt, .sampling = test::greedy_params(), .num_draft = 2, .max_tokens = 8};
    const test::CacheRun answer = test::exact_run(*c->gen, r);
    EXPECT_EQ(answer.cached, want);
    previous = prompt;
    prompt = test::concat(prompt, answer.tokens);
    std::uniform_int_distribution<int> extra(60, 120);
    prompt = test::concat(prompt, test::random_tokens(c->gen->vocab_size(), extra(rng), rng));
  }
  const PrefixCacheStats& s = c->cache().stats();
  EXPECT_GT(s.evictions, 0) << s.stored_bytes << " bytes stored";
  EXPECT_GT(s.demotions, 0);
  EXPECT_EQ(s.hits, turns - 1);
  std::printf(
      "%d turns, %zu tokens: %lld bytes stored, %lld evictions, %lld demotions; block %lld B, snapshot %lld "
      "B\n",
      turns, previous.size(), static_cast<long long>(s.stored_bytes), static_cast<long long>(s.evictions),
      static_cast<long long>(s.demotions), static_cast<long long>(c->cache().block_bytes()),
      static_cast<long long>(c->cache().snapshot_bytes()));
}

TEST(PrefixCache, ZeroBudgetsStoreNothing) {
  std::unique_ptr<CacheFixture> c = open_cached("qwen35-text-f32", {});
  std::mt19937 rng(4);
  const std::vector<int32_t> p = test::random_tokens(c->gen->vocab_size(), 200, rng);
  EXPECT_EQ(expect_exact_hit(*c->gen, {.prompt = p, .sampling = test::greedy_params()}), 0);
  EXPECT_EQ(expect_exact_hit(*c->gen, {.prompt = p, .sampling = test::greedy_params()}), 0);
  EXPECT_EQ(c->cache().stats().blocks, 0);
  EXPECT_EQ(c->cache().stats().lookups, 2);
}

// A hit of any length restores every block and the snapshot with one copy_many call and no other copy, from
// either memory tier (the cost of a restore does not grow with its number of blocks).
TEST(PrefixCache, RestoresWithOneCopyCall) {
  Expected<Checkpoint> ck = load_checkpoint(golden::fixtures_dir() + "/qwen35-bf16");
  ASSERT_TRUE(ck.has_value()) << ck.status().to_string();
  for (const bool host : {false, true}) {
    SCOPED_TRACE(host ? "host memory" : "backend memory");
    test::CountingBackend be(create_backend({.name = "cpu", .threads = 1}).value());
    std::unique_ptr<Model> m = create_model(ck->config, ck->weights, be, {.max_rows = 128}).value();
    std::unique_ptr<Generator> g =
        Generator::create(*m, {.ctx_size = 1024, .kv_dtype = DType::kBF16, .max_draft = 4, .mtp = true})
            .value();
    const int64_t budget = int64_t{256} << 20;
    ASSERT_TRUE(g->enable_prefix_cache({.device_budget = host ? 0 : budget, .host_budget = host ? budget : 0})
                    .is_ok());
    std::mt19937 rng(7);
    const std::vector<int32_t> prompt = test::random_tokens(ck->config.vocab_size, 9 * kPrefixBlock + 2, rng);
    ASSERT_EQ(test::run_request(*g, {.prompt = prompt, .sampling = test::greedy_params()}, true).cached, 0);
    for (const int blocks : {2, 4, 9}) {  // prefill chunks of 128 rows: snapshots at 128, 256, ..., 576
      SequenceState st = m->new_state({.ctx_size = 1024, .kv_dtype = DType::kBF16, .max_rows = 5}).value();
      be.copies = be.copy_manys = be.uploads_outside = be.downloads = 0;
      PrefixCache& cache = *g->prefix_cache();
      const Expected<Tensor> hidden = cache.restore(st, prompt, blocks * kPrefixBlock);
      ASSERT_TRUE(hidden.has_value()) << hidden.status().to_string();
      EXPECT_EQ(st.length(), blocks * kPrefixBlock);
      EXPECT_EQ(be.copy_manys, 1) << blocks << " blocks";
      EXPECT_EQ(be.copies + be.uploads_outside + be.downloads, 0) << blocks << " blocks";
    }
    EXPECT_EQ(g->prefix_cache()->stats().host_bytes > 0, host);
  }
}

TEST(PrefixCache, BadInputIsRefused) {
  Expected<std::unique_ptr<golden::Fixture>> fx = golden::Fixture::open("qwen35-text-f32", 1, 100);
  ASSERT_TRUE(fx.has_value()) << fx.status().to_string();
  Model& m = *(*fx)->model;
  Expected<std::unique_ptr<Generator>> gen = Generator::create(m, {.ctx_size = 512});
  ASSERT_TRUE(gen.has_value());
  const Status unaligned = (*gen)->enable_prefix_cache(kLarge);
  EXPECT_FALSE(unaligned.is_ok());
  EXPECT_NE(unaligned.message().find("multiple of 64"), std::string::npos) << unaligned.message();

  EXPECT_FALSE(PrefixCache::create(m.backend(), m.cache_spec(), DType::kBF16, m.config().hidden_size,
                                   {.device_budget = -1, .host_budget = 0, .mtp = false})
                   .has_value());
  EXPECT_FALSE(PrefixCache::create(m.backend(), m.cache_spec(), DType::kF16, m.config().hidden_size, kLarge)
                   .has_value());
  Expected<std::unique_ptr<PrefixCache>> cache =
      PrefixCache::create(m.backend(), m.cache_spec(), DType::kBF16, m.config().hidden_size, kLarge);
  ASSERT_TRUE(cache.has_value());
  Expected<SequenceState> st = m.new_state({.ctx_size = 512});
  ASSERT_TRUE(st.has_value());
  const std::vector<int32_t> tokens(128, 1);
  EXPECT_FALSE((*cache)->restore(*st, tokens, 64).has_value()) << "nothing cached";
  EXPECT_FALSE((*cache)->restore(*st, tokens, 0).has_value());
  EXPECT_FALSE((*cache)->store(*st, tokens, 64, Tensor{}).is_ok()) << "the state holds 0 tokens";
  EXPECT_FALSE((*cache)->store(*st, tokens, 30, Tensor{}).is_ok()) << "not a block boundary";
  EXPECT_TRUE((*cache)->check().is_ok());
}

}  // namespace
}  // namespace pd
