// The generator on the CUDA backend (decode/cycle_runner.h): every plain step and MTP cycle is one recorded
// step, replayed as a CUDA graph, with one host wait. Checked against independent references:
//   - plain decoding on the GPU: greedy tokens of MTP cycles (the real head, an oracle drafter that is always
//     right, a drafter right for a random prefix, so every rollback offset happens) and seeded tokens equal
//     them, for K = 1..4, also with the draft vocabulary option;
//   - the same requests on a CUDA backend with graphs off (PD_CUDA_GRAPHS=0, every op launched eagerly):
//     tokens and logprobs bit for bit, so capture and replay (staged uploads, drafts read on the device,
//     rollbacks, buffers that grow in a step) change nothing;
//   - the backend's counters: one host wait per step and cycle, most steps replayed as graphs, and plain
//   steps
//     with the MTP head observing them replayed, not recorded anew.
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "cuda/cuda_test_util.h"
#include "golden/fixture_util.h"
#include "puredrive/backend/cuda/cuda_backend.h"
#include "puredrive/decode/exactness_gates.h"
#include "puredrive/decode/generator.h"
#include "puredrive/decode/mtp_drafter.h"
#include "puredrive/decode/scripted_drafter.h"

namespace pd {
namespace {

struct GpuGenerator {
  Checkpoint ckpt;
  std::unique_ptr<Backend> be;
  std::unique_ptr<Model> model;
  std::unique_ptr<Generator> gen;
};

// How a backend launches its steps: environment switches read when it is created.
struct Launches {
  const char* name = "graphs";
  const char* env = nullptr;  // the switch, or null: the default (one graph per step shape)
  const char* value = nullptr;
};
constexpr Launches kGraphs{};
constexpr Launches kEager{"eager", "PD_CUDA_GRAPHS", "0"};

// A fixture's generator on a fresh CUDA backend, or null with the reason.
std::unique_ptr<GpuGenerator> open_gpu(const std::string& fixture, const Launches& launches, std::string* why,
                                       int draft_vocab = 0) {
  auto g = std::make_unique<GpuGenerator>();
  if (launches.env != nullptr) setenv(launches.env, launches.value, 1);
  g->be = cudatest::try_cuda(why);
  if (launches.env != nullptr) unsetenv(launches.env);
  if (g->be == nullptr) return nullptr;
  Expected<Checkpoint> ck = load_checkpoint(golden::fixtures_dir() + "/" + fixture);
  PD_ASSERT(ck.has_value(), "{}", ck.status().to_string());
  g->ckpt = std::move(ck).value();
  Expected<std::unique_ptr<Model>> m =
      create_model(g->ckpt.config, g->ckpt.weights, *g->be, {.max_rows = 16, .mtp_draft_vocab = draft_vocab});
  PD_ASSERT(m.has_value(), "{}", m.status().to_string());
  g->model = std::move(m).value();
  Expected<std::unique_ptr<Generator>> gen =
      Generator::create(*g->model, {.ctx_size = 512, .kv_dtype = DType::kBF16, .max_draft = 4, .mtp = true});
  PD_ASSERT(gen.has_value(), "{}", gen.status().to_string());
  g->gen = std::move(gen).value();
  return g;
}

std::vector<int32_t> prompt_of(const std::string& fixture, int which) {
  Expected<std::unique_ptr<golden::Fixture>> fx = golden::Fixture::open(fixture, 1, 16);
  PD_ASSERT(fx.has_value(), "{}", fx.status().to_string());
  return (*fx)->ref_ints((*fx)->prompts[static_cast<size_t>(which)] + ".input_ids");
}

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

SamplingParams seeded(uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_p = 0.9f;
  p.seed = seed;
  return p;
}

// A sequence for tests that run the model's steps themselves, outside the generator.
Expected<SequenceState> step_state(const GpuGenerator& g) {
  return g.model->new_state({.ctx_size = 256, .kv_dtype = DType::kBF16, .max_rows = 8});
}

class CudaGenerator : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaGenerator, MtpCyclesEqualPlainDecoding) {
  std::string why;
  for (int draft_vocab : {0, 64}) {
    std::unique_ptr<GpuGenerator> g = open_gpu(GetParam(), kGraphs, &why, draft_vocab);
    if (g == nullptr) GTEST_SKIP() << "no CUDA device: " << why;
    ASSERT_TRUE(g->gen->has_drafter());
    const int tokens = cudatest::quick() ? 32 : 128;
    for (int pi : {1, 2}) {
      const std::vector<int32_t> prompt = prompt_of(GetParam(), pi);
      DecodeRequest plain_req;
      plain_req.prompt = prompt;
      plain_req.sampling = greedy();
      plain_req.max_tokens = tokens + 4;
      Expected<DecodeResult> plain = g->gen->generate(plain_req);
      ASSERT_TRUE(plain.has_value()) << plain.status().to_string();
      for (int k = 1; k <= 4; ++k) {
        for (gates::DraftSource src :
             {gates::DraftSource::kMtp, gates::DraftSource::kOracle, gates::DraftSource::kRandomPrefix}) {
          const gates::IdentityCase c{.prompt = prompt,
                                      .sampling = greedy(),
                                      .num_draft = k,
                                      .source = src,
                                      .num_tokens = tokens,
                                      .drafter_seed = static_cast<uint64_t>(10 * k + pi)};
          Expected<gates::IdentityReport> r = gates::check_identity(*g->gen, c, &plain->tokens);
          ASSERT_TRUE(r.has_value()) << r.status().to_string();
          const std::string what = fmt::format("draft vocab {} prompt {} K={} {}: {}", draft_vocab, pi, k,
                                               gates::draft_source_name(src), r->summary());
          EXPECT_TRUE(r->identical()) << what;
          if (src == gates::DraftSource::kOracle) {
            EXPECT_TRUE(r->all_accepted()) << what;
          }
        }
      }
      for (uint64_t seed : {1u, 2u}) {
        const gates::IdentityCase c{
            .prompt = prompt, .sampling = seeded(seed), .num_draft = 3, .num_tokens = tokens};
        Expected<gates::IdentityReport> r = gates::check_identity(*g->gen, c);
        ASSERT_TRUE(r.has_value()) << r.status().to_string();
        EXPECT_TRUE(r->identical()) << "seeded " << seed << ": " << r->summary();
      }
    }
  }
}

// The requests of GraphsEqualEagerLaunches on two backends of the fixture.
void compare_launches(const std::string& fixture, GpuGenerator& on, GpuGenerator& off) {
  const std::vector<int32_t> prompt = prompt_of(fixture, 2);
  DecodeRequest plain_req;
  plain_req.prompt = prompt;
  plain_req.sampling = greedy();
  plain_req.max_tokens = 100;
  Expected<DecodeResult> plain = off.gen->generate(plain_req);
  ASSERT_TRUE(plain.has_value()) << plain.status().to_string();
  const int V = on.ckpt.config.vocab_size;
  for (const SamplingParams& sampling : {greedy(), seeded(7)}) {
    for (bool scripted : {false, true}) {
      SCOPED_TRACE(
          fmt::format("temperature {}, {} drafter", sampling.temperature, scripted ? "scripted" : "MTP"));
      std::vector<DecodeResult> results;
      std::vector<std::vector<uint32_t>> logprob_bits;
      for (GpuGenerator* g : {&on, &off}) {
        ScriptedDrafter drafter(plain->tokens, ScriptedDrafter::Mode::kRandomPrefix, V, 5);
        DecodeRequest req;
        req.prompt = prompt;
        req.sampling = sampling;
        req.max_tokens = 96;
        req.num_draft = 3;
        req.top_logprobs = 3;
        req.drafter = scripted ? &drafter : nullptr;
        std::vector<uint32_t> bits;
        Expected<DecodeResult> r = g->gen->generate(req, [&](const DecodeChunk& c) {
          for (const TokenLogprobs& lp : c.logprobs) {
            uint32_t b = 0;
            std::memcpy(&b, &lp.logprob, sizeof b);
            bits.push_back(b);
            for (const auto& [id, alt] : lp.top) {
              std::memcpy(&b, &alt, sizeof b);
              bits.push_back(static_cast<uint32_t>(id));
              bits.push_back(b);
            }
          }
          return true;
        });
        ASSERT_TRUE(r.has_value()) << r.status().to_string();
        EXPECT_GT(bits.size(), r->tokens.size());
        results.push_back(std::move(*r));
        logprob_bits.push_back(std::move(bits));
      }
      EXPECT_EQ(results[0].tokens, results[1].tokens);
      EXPECT_EQ(results[0].cycle_accepted, results[1].cycle_accepted);
      EXPECT_EQ(logprob_bits[0], logprob_bits[1]) << "logprobs differ";
    }
  }
}

// The same requests with graphs on and off, and with the experiment switches of the graphs (a step in
// graphs of a few ops each; every new step shape eager once): the same tokens and logprobs, bit for bit.
TEST_P(CudaGenerator, GraphsEqualEagerLaunches) {
  std::string why;
  std::unique_ptr<GpuGenerator> off = open_gpu(GetParam(), kEager, &why);
  if (off == nullptr) GTEST_SKIP() << "no CUDA device: " << why;
  for (const Launches& launches : {kGraphs, Launches{"graph segments", "PD_GRAPH_SEGMENT", "5"},
                                   Launches{"first sight eager", "PD_GRAPH_FIRST_SIGHT", "1"}}) {
    SCOPED_TRACE(launches.name);
    std::unique_ptr<GpuGenerator> on = open_gpu(GetParam(), launches, &why);
    ASSERT_NE(on, nullptr) << why;
    compare_launches(GetParam(), *on, *off);
  }
}

// One host wait per plain step and per cycle, and the cycles replayed as graphs.
TEST_P(CudaGenerator, OneHostWaitPerCycle) {
  std::string why;
  std::unique_ptr<GpuGenerator> g = open_gpu(GetParam(), kGraphs, &why);
  if (g == nullptr) GTEST_SKIP() << "no CUDA device: " << why;
  DecodeRequest req;
  req.prompt = {11};  // nothing to prefill: every wait belongs to the decode loop
  req.sampling = greedy();
  req.max_tokens = 80;
  req.num_draft = 2;
  ASSERT_TRUE(g->gen->generate(req).has_value());  // warm-up: buffers sized, graphs captured
  const CudaStepStats s0 = *cuda_step_stats(*g->be);
  Expected<DecodeResult> r = g->gen->generate(req);
  ASSERT_TRUE(r.has_value()) << r.status().to_string();
  const CudaStepStats s1 = *cuda_step_stats(*g->be);
  EXPECT_GT(r->accept.cycles, 10);
  EXPECT_EQ(s1.host_waits - s0.host_waits, r->steps) << r->summary();
  EXPECT_GE(s1.graph_replays - s0.graph_replays, r->steps)
      << "eager steps: " << s1.eager_steps - s0.eager_steps;
  EXPECT_EQ(s1.eager_steps - s0.eager_steps, 0);
}

// Plain steps with the MTP head observing (the adaptive draft length's plain stretches): the head's pending
// rows take a few places, so after a warm-up no step records a new graph. Each step once had its row copied
// to a new place, and recorded a graph of its own.
TEST_P(CudaGenerator, PlainStepsWithTheHeadReplayTheirGraphs) {
  std::string why;
  std::unique_ptr<GpuGenerator> g = open_gpu(GetParam(), kGraphs, &why);
  if (g == nullptr) GTEST_SKIP() << "no CUDA device: " << why;
  Expected<SequenceState> st = step_state(*g);
  ASSERT_TRUE(st.has_value()) << st.status().to_string();
  Expected<std::unique_ptr<MtpDrafter>> head = MtpDrafter::create(*g->model);
  ASSERT_TRUE(head.has_value()) << head.status().to_string();
  auto run_steps = [&](int first, int count) {
    for (int32_t n = first; n < first + count; ++n) {
      const int32_t token = 11 + n % 5;
      ASSERT_TRUE(g->be->begin_step().is_ok());
      Expected<StepOutput> o = g->model->forward(*st, std::span(&token, 1), std::span(&n, 1),
                                                 {.logits = LogitRows::kLast, .tap = {}});
      ASSERT_TRUE(o.has_value()) << o.status().to_string();
      const int32_t next = 11 + (n + 1) % 5;
      ASSERT_TRUE((*head)->observe(*st, n, std::span(&next, 1), o->hidden).is_ok());
      ASSERT_TRUE(g->be->end_step().is_ok());
    }
  };
  const CudaStepStats start = *cuda_step_stats(*g->be);
  run_steps(0, 3 * MtpDrafter::kPendingRows);  // every shape once
  const CudaStepStats s0 = *cuda_step_stats(*g->be);
  // Two shapes: the step that places its row in the head's buffer (at any of its offsets) and the one that
  // also runs the buffer through the head; one more where a step grew a buffer and ran eagerly.
  EXPECT_LE(s0.graphs_captured - start.graphs_captured, 3);
  run_steps(3 * MtpDrafter::kPendingRows, 5 * MtpDrafter::kPendingRows);
  const CudaStepStats s1 = *cuda_step_stats(*g->be);
  EXPECT_LE((*head)->pending_rows(), MtpDrafter::kPendingRows);
  EXPECT_EQ(s1.graphs_captured - s0.graphs_captured, 0);
  EXPECT_EQ(s1.graph_replays - s0.graph_replays, 5 * MtpDrafter::kPendingRows);
}

// A prefill step runs eagerly the first time its shape is seen and records a graph the second time: a prompt
// of a new length does not pay for a graph it will not replay.
TEST_P(CudaGenerator, PrefillStepsRecordAGraphWhenTheirShapeComesBack) {
  std::string why;
  std::unique_ptr<GpuGenerator> g = open_gpu(GetParam(), kGraphs, &why);
  if (g == nullptr) GTEST_SKIP() << "no CUDA device: " << why;
  Expected<SequenceState> st = step_state(*g);
  ASSERT_TRUE(st.has_value()) << st.status().to_string();
  auto prefill = [&](int rows) {
    ASSERT_TRUE(st->reset().is_ok());
    std::vector<int32_t> tokens(static_cast<size_t>(rows)), positions(static_cast<size_t>(rows));
    for (int i = 0; i < rows; ++i) {
      tokens[static_cast<size_t>(i)] = 11 + i % 5;
      positions[static_cast<size_t>(i)] = i;
    }
    ASSERT_TRUE(g->be->begin_step().is_ok());
    Expected<StepOutput> o =
        g->model->forward(*st, tokens, positions, {.logits = LogitRows::kLast, .tap = {}, .prefill = true});
    ASSERT_TRUE(o.has_value()) << o.status().to_string();
    ASSERT_TRUE(g->be->end_step().is_ok());
  };
  prefill(13);  // the buffers grow for the widest step
  const CudaStepStats s0 = *cuda_step_stats(*g->be);
  for (int i = 0; i < 3; ++i) prefill(12);
  const CudaStepStats s1 = *cuda_step_stats(*g->be);
  EXPECT_EQ(s1.eager_steps - s0.eager_steps, 1) << "the first 12-row prefill runs eagerly";
  EXPECT_EQ(s1.graphs_captured - s0.graphs_captured, 1) << "the second records its graph";
  EXPECT_EQ(s1.graph_replays - s0.graph_replays, 2);
}

TEST(CudaGeneratorWindow, TheAttentionWindowIsRefusedWithAReason) {
  std::string why;
  std::unique_ptr<Backend> be = cudatest::try_cuda(&why);
  if (be == nullptr) GTEST_SKIP() << "no CUDA device: " << why;
  Expected<Checkpoint> ck = load_checkpoint(golden::fixtures_dir() + "/qwen35-bf16");
  ASSERT_TRUE(ck.has_value());
  Expected<std::unique_ptr<Model>> m =
      create_model(ck->config, ck->weights, *be, {.max_rows = 16, .mtp_window = 8});
  ASSERT_TRUE(m.has_value()) << m.status().to_string();
  Expected<std::unique_ptr<Generator>> gen =
      Generator::create(**m, {.ctx_size = 256, .kv_dtype = DType::kBF16, .max_draft = 2, .mtp = true});
  ASSERT_TRUE(gen.has_value());
  DecodeRequest req;
  req.prompt = {1, 2, 3, 4, 5};
  req.sampling = greedy();
  req.max_tokens = 8;
  req.num_draft = 2;
  Expected<DecodeResult> r = (*gen)->generate(req);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.status().message().find("window"), std::string::npos) << r.status().message();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaGenerator, ::testing::Values("qwen35-bf16", "qwen35-mlx-q"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string n = p.param;
                           for (char& ch : n) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace pd
