// The sample op on the GPU against the CPU backend's op (the reference): every output word, the drafts and
// the history, bitwise, on random rows of every shape (ties, -inf, flat, spiky), every rule, k = 0..4, draws
// with prior drafts, logprobs, penalties with long histories, small vocabularies and the real one (248320),
// errors. Skipped without a GPU.
#include <gtest/gtest.h>

#include "cuda/cuda_test_util.h"
#include "cuda/sample_cases.h"
#include "puredrive/backend/cpu/test_util.h"
#include "puredrive/backend/cuda/cuda_backend.h"

namespace pd {
namespace {

using sampletest::SampleCase;
using sampletest::SampleResult;

void expect_same(Backend& gpu, const std::vector<SampleCase>& cases) {
  std::unique_ptr<Backend> cpu = test::cpu_backend(2);
  int errors = 0;
  for (const SampleCase& c : cases) {
    Expected<SampleResult> ref = sampletest::run_on(*cpu, c);
    ASSERT_TRUE(ref.has_value()) << c.name << ": " << ref.status().to_string();
    Expected<SampleResult> got = sampletest::run_on(gpu, c);
    ASSERT_TRUE(got.has_value()) << c.name << ": " << got.status().to_string();
    EXPECT_EQ(*got, *ref) << c.name << "\n  cpu:  " << sampletest::describe(*ref)
                          << "\n  cuda: " << sampletest::describe(*got);
    if (ref->out[0] != 0) ++errors;
  }
  std::printf("%zu cases, %d of them errors\n", cases.size(), errors);
}

TEST(CudaSample, MixedCasesSmallVocabularies) {
  PD_CUDA_OR_SKIP(gpu);
  expect_same(*gpu, sampletest::mixed_cases(1, cudatest::quick() ? 60 : 400, {1, 2, 7, 33, 300, 4096, 5000}));
}

TEST(CudaSample, MixedCasesRealVocabulary) {
  PD_CUDA_OR_SKIP(gpu);
  expect_same(*gpu, sampletest::mixed_cases(2, cudatest::quick() ? 6 : 40, {248320}));
}

TEST(CudaSample, EdgeParams) {
  // Each edge on its own over a smooth and a tied row: top_p = 1 and tiny, top_k = 1 and V, min_p = 1,
  // temperatures near 0, flat rows where everything ties.
  PD_CUDA_OR_SKIP(gpu);
  sampletest::CaseMaker m(3);
  std::vector<SampleCase> cases;
  for (int vocab : {64, 248320}) {
    for (int shape : {0, 1, 2}) {
      for (int edge = 0; edge < 8; ++edge) {
        SampleCase c =
            m.make(vocab, 3, SampleRule::kBlock, fmt::format("edge {} shape {} V={}", edge, shape, vocab));
        for (int j = 0; j < 3; ++j) {
          const std::vector<float> z = m.row(vocab, shape);
          std::copy(z.begin(), z.end(), c.logits.begin() + static_cast<std::ptrdiff_t>(j) * vocab);
        }
        SampleParams& p = c.target;
        p = SampleParams{};
        switch (edge) {
          case 0:
            p.top_p = 1.0f;
            break;
          case 1:
            p.top_p = 1e-7f;
            break;
          case 2:
            p.top_k = 1;
            break;
          case 3:
            p.top_k = vocab;
            break;
          case 4:
            p.min_p = 1.0f;
            break;
          case 5:
            p.temperature = 1e-7f;
            break;
          case 6:
            p.temperature = 1e-3f;
            p.top_k = 7;
            p.top_p = 0.6f;
            break;
          default:
            p.top_k = 3000;
            p.top_p = 0.9999f;
            break;
        }
        c.rule = SampleRule::kSeeded;  // the drafts were not drawn from q: check p alone
        c.draft_logits.clear();
        cases.push_back(std::move(c));
      }
    }
  }
  expect_same(*gpu, cases);
}

TEST(CudaSample, DeepSelection) {
  PD_CUDA_OR_SKIP(gpu);
  for (int vocab : {300, 5000, 248320}) {
    if (cudatest::quick() && vocab > 5000) continue;
    expect_same(*gpu, sampletest::deep_cases(static_cast<uint64_t>(vocab), vocab));
  }
}

TEST(CudaSample, ErrorsAreReportedLikeTheReference) {
  PD_CUDA_OR_SKIP(gpu);
  expect_same(*gpu, sampletest::error_cases(300));
  expect_same(*gpu, sampletest::error_cases(248320));
}

TEST(CudaSample, StepCaptureReplaysWithNewControl) {
  // The op inside recorded steps (CUDA graphs), buffers held across calls as a decode loop holds them: each
  // replay with new uniforms, seed and position gives what the CPU gives for them.
  PD_CUDA_OR_SKIP(gpu);
  std::unique_ptr<Backend> cpu = test::cpu_backend(2);
  sampletest::CaseMaker m(4);
  for (SampleRule rule : {SampleRule::kBlock, SampleRule::kSeeded}) {
    SampleCase c = m.make(5000, 3, rule, "captured");
    c.commit = false;  // the same inputs every run
    c.write_draft = false;
    Expected<sampletest::SampleBuffers> b = sampletest::upload_case(*gpu, c);
    ASSERT_TRUE(b.has_value()) << b.status().to_string();
    for (int run = 0; run < 4; ++run) {
      c.control = m.control(c.rows);
      const Expected<SampleResult> ref = sampletest::run_on(*cpu, c);
      ASSERT_TRUE(ref.has_value()) << ref.status().to_string();
      ASSERT_TRUE(gpu->begin_step().is_ok());
      ASSERT_TRUE(gpu->upload(b->args.control, c.control.data()).is_ok());
      ASSERT_TRUE(gpu->sample(b->args).is_ok());
      ASSERT_TRUE(gpu->end_step().is_ok());
      const Expected<SampleResult> got = sampletest::read_result(*gpu, *b);
      ASSERT_TRUE(got.has_value()) << got.status().to_string();
      EXPECT_EQ(got->out, ref->out) << "run " << run << ": " << sampletest::describe(*got) << " vs "
                                    << sampletest::describe(*ref);
    }
  }
  const std::optional<CudaStepStats> stats = cuda_step_stats(*gpu);
  ASSERT_TRUE(stats.has_value());
  std::printf("graphs captured %ld, replays %ld, eager steps %ld\n",
              static_cast<long>(stats->graphs_captured), static_cast<long>(stats->graph_replays),
              static_cast<long>(stats->eager_steps));
  // Only the first recorded step may run eagerly: it grows the upload staging (a graph would keep the old
  // address).
  EXPECT_LE(stats->eager_steps, 1);
}

}  // namespace
}  // namespace pd
