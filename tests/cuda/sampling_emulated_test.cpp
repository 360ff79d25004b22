// The sample op's CUDA kernels (backend/cuda/sampling_*.cu) run on the CPU by tests/cuda/cuda_emulation.h,
// against the CPU backend's op (the reference): every output word, the drafts and the history, bitwise.
// This checks the kernels' logic (radix selection, exact sums, scans, the last-block pattern, the rules) on
// machines without a GPU; cuda_sampling_test.cpp checks the same on the device.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "cuda/sample_cases.h"
#include "puredrive/backend/cpu/cpu_backend.h"

// clang-format off: the emulation must come before the kernel source.
#include "cuda/cuda_emulation.h"
#include "puredrive/backend/cuda/sampling_accept.cu"
#include "puredrive/backend/cuda/sampling_select.cu"
// clang-format on

namespace pd {
namespace {

using sampletest::SampleCase;
using sampletest::SampleResult;

cuda::SampleRowParams row_params(const SampleParams& p) {
  return {.temperature = p.temperature,
          .top_k = p.top_k,
          .top_p = p.top_p,
          .min_p = p.min_p,
          .presence = p.presence_penalty,
          .frequency = p.frequency_penalty,
          .repetition = p.repetition_penalty};
}

SampleResult run_emulated(const SampleCase& c) {
  SampleResult r;
  r.drafts = c.drafts;
  r.history = c.history;
  r.out.assign(static_cast<size_t>(sample_out_words(c.rows, c.logprobs)), 12345);
  const bool needs_q = c.rule == SampleRule::kTokenwise || c.rule == SampleRule::kBlock;
  cuda::SampleLaunch l;
  l.rule = static_cast<cuda::SampleRule>(c.rule);
  l.faulty = static_cast<cuda::Faulty>(c.faulty);
  l.target = row_params(c.target);
  l.draft = row_params(c.draft);
  l.logits = c.logits.data();
  l.logits_stride = c.vocab;
  l.rows = c.rows;
  l.vocab = c.vocab;
  l.draft_rows = needs_q ? c.rows - 1 : 0;
  l.draft_logits = c.draft_logits.empty() ? nullptr : c.draft_logits.data();
  l.draft_stride = c.vocab;
  l.drafts = r.drafts.empty() ? nullptr : r.drafts.data();
  l.prior = c.prior;
  l.write_draft = c.write_draft;
  l.bias = c.bias.empty() ? nullptr : c.bias.data();
  l.history = r.history.empty() ? nullptr : r.history.data();
  l.commit = c.commit;
  l.control = c.control.data();
  l.logprobs = c.logprobs;
  l.out = r.out.data();
  // Garbage in the scratch, as cudaMalloc leaves it: the kernels must initialise what they read.
  std::vector<uint64_t> scratch(
      static_cast<size_t>(cuda::sample_scratch_bytes(l.rows, l.draft_rows, l.vocab, l.logprobs) / 8 + 1),
      0x5a5a5a5a5a5a5a5aULL);
  l.scratch = scratch.data();
  cuda::launch_sample(l, nullptr);
  return r;
}

void expect_same(const std::vector<SampleCase>& cases) {
  std::unique_ptr<Backend> cpu = make_cpu_backend({.name = "cpu", .threads = 1});
  int errors = 0;
  for (const SampleCase& c : cases) {
    Expected<SampleResult> ref = sampletest::run_on(*cpu, c);
    ASSERT_TRUE(ref.has_value()) << c.name << ": " << ref.status().to_string();
    const SampleResult got = run_emulated(c);
    EXPECT_EQ(got, *ref) << c.name << "\n  cpu:  " << sampletest::describe(*ref)
                         << "\n  cuda: " << sampletest::describe(got);
    if (ref->out[0] != 0) ++errors;
  }
  std::printf("%zu cases, %d of them errors\n", cases.size(), errors);
}

TEST(SampleEmulated, MixedCasesSmallVocabularies) {
  expect_same(sampletest::mixed_cases(1, 120, {1, 2, 7, 33, 300}));
}

TEST(SampleEmulated, MixedCasesSeveralBlocksPerRow) {
  // 5000 tokens: three blocks of 2048 per row, so the last-block reductions run (and the grid-wide selection
  // passes in the deep build, which takes them on every row size).
  expect_same(sampletest::mixed_cases(2, 16, {5000}));
}

TEST(SampleEmulated, DeepSelection) {
  expect_same(sampletest::deep_cases(5, 300));
  expect_same(sampletest::deep_cases(6, 5000));
}

// A call is a handful of launches on a small vocabulary (each is a graph node, about as costly as the work of
// a small model's row): greedy prep and decide + finish; seeded with top_p the weights and one block's
// selection, the scores, and decide + finish.
TEST(SampleEmulated, SmallVocabularyCallsAreFewLaunches) {
  sampletest::CaseMaker m(9);
  const int vocab = 300;
  const int passes =
      vocab <= cuda::smp::kSelectAloneBlocks * cuda::smp::kChunk ? 0 : cuda::smp::kSelectPasses;
  for (const auto& [rule, launches] :
       {std::pair{SampleRule::kGreedy, 3}, std::pair{SampleRule::kSeeded, 6}}) {
    SampleCase c = m.make(vocab, 3, rule, "launch count");
    c.logprobs = -1;
    if (rule == SampleRule::kSeeded) {
      c.target = SampleParams{};
      c.target.temperature = 0.8f;
      c.target.top_p = 0.95f;
    }
    const int64_t before = emu::state().launches;
    (void)run_emulated(c);
    EXPECT_EQ(emu::state().launches - before, rule == SampleRule::kSeeded ? launches + passes : launches)
        << "rule " << static_cast<int>(rule);
  }
}

TEST(SampleEmulated, ErrorsAreReportedLikeTheReference) {
  expect_same(sampletest::error_cases(300));
}

}  // namespace
}  // namespace pd
