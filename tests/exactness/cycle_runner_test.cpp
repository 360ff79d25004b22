// The generator's cycle as the device sees it (decode/cycle_runner.h), on the CPU backend:
//   - a step whose token ids come from device memory (ForwardOptions::device_tokens: the drafts of an MTP
//     cycle) gives bitwise the logits and hidden states of the same step with the ids from the host;
//   - every plain step and every MTP cycle of a request waits for the device exactly once (one download),
//     never downloads or synchronises inside a recorded step (which would make a CUDA graph eager), uploads
//     nothing outside one after the prompt, and leaves no step open; counted by a backend that wraps the
//     CPU backend, for the real MTP head and a drafter that picks its tokens on the host.
#include <fmt/format.h>

#include <cstring>
#include <numeric>

#include "exactness/counting_backend.h"
#include "exactness/generator_test_util.h"

namespace pd::exactness {
namespace {

std::vector<int32_t> iota_from(int first, int n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

TEST(DeviceTokens, StepsReadTheirTokenIdsFromTheDevice) {
  Expected<std::unique_ptr<golden::Fixture>> fx_or = golden::Fixture::open("qwen35-text-f32", 1, 16);
  ASSERT_TRUE(fx_or.has_value()) << fx_or.status().to_string();
  golden::Fixture& fx = **fx_or;
  Model& m = *fx.model;
  Backend& be = *fx.backend;
  const std::vector<int32_t> prompt = fx.ref_ints(fx.prompts[1] + ".input_ids");
  const std::vector<int32_t> rows = {7, 19, 3, 250};
  Expected<Buffer> dev = be.alloc(DType::kI32, 1, 8);
  ASSERT_TRUE(dev.has_value());
  ASSERT_TRUE(be.upload(dev->tensor().col_slice(0, 3), rows.data() + 1).is_ok());

  auto run = [&](bool device) {
    SequenceState st = fx.new_state(64, DType::kF32, 8);
    const int n = static_cast<int>(prompt.size());
    Expected<StepOutput> o = m.forward(st, prompt, iota_from(0, n), {.logits = LogitRows::kNone, .tap = {}});
    PD_ASSERT(o.has_value(), "{}", o.status().to_string());
    std::vector<int32_t> host = rows;
    if (device) std::fill(host.begin() + 1, host.end(), 0);  // placeholders
    ForwardOptions opt{.logits = LogitRows::kAll, .tap = {}};
    if (device) {
      opt.device_tokens = dev->tensor();
      opt.device_tokens_from = 1;
    }
    o = m.forward(st, host, iota_from(n, 4), opt);
    PD_ASSERT(o.has_value(), "{}", o.status().to_string());
    std::vector<float> out = fx.download(o->logits), hidden = fx.download(o->hidden);
    out.insert(out.end(), hidden.begin(), hidden.end());
    return out;
  };
  const std::vector<float> host = run(false), device = run(true);
  ASSERT_EQ(host.size(), device.size());
  EXPECT_EQ(std::memcmp(host.data(), device.data(), host.size() * sizeof(float)), 0);

  // Bad device tokens are refused with their shape.
  SequenceState st = fx.new_state(64, DType::kF32, 8);
  Expected<Buffer> f32 = be.alloc(DType::kF32, 1, 8);
  ASSERT_TRUE(f32.has_value());
  Expected<StepOutput> bad = m.forward(st, rows, iota_from(0, 4),
                                       {.logits = LogitRows::kLast,
                                        .tap = {},
                                        .prefill = false,
                                        .device_tokens = f32->tensor(),
                                        .device_tokens_from = 1});
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.status().message().find("need I32"), std::string::npos) << bad.status().message();
}

TEST(CycleRunner, OneHostWaitPerStepAndCycle) {
  const std::string dir = golden::fixtures_dir() + "/qwen35-bf16";
  Expected<Checkpoint> ckpt = load_checkpoint(dir);
  ASSERT_TRUE(ckpt.has_value()) << ckpt.status().to_string();
  Expected<std::unique_ptr<Backend>> cpu = create_backend({.name = "cpu", .threads = 1});
  ASSERT_TRUE(cpu.has_value());
  test::CountingBackend be(std::move(*cpu));
  Expected<std::unique_ptr<Model>> m = create_model(ckpt->config, ckpt->weights, be, {.max_rows = 16});
  ASSERT_TRUE(m.has_value()) << m.status().to_string();
  Expected<std::unique_ptr<Generator>> g =
      Generator::create(**m, {.ctx_size = 256, .kv_dtype = DType::kF32, .max_draft = 4, .mtp = true});
  ASSERT_TRUE(g.has_value()) << g.status().to_string();
  const int V = ckpt->config.vocab_size;

  // The plain run's tokens, for a drafter that picks its tokens on the host (right for a random prefix).
  DecodeRequest req;
  req.prompt = {11};  // one token: nothing to prefill, so everything after sampler setup is the decode loop
  req.sampling = greedy();
  req.max_tokens = 60;
  Expected<DecodeResult> plain = (*g)->generate(req);
  ASSERT_TRUE(plain.has_value()) << plain.status().to_string();
  ScriptedDrafter scripted(plain->tokens, ScriptedDrafter::Mode::kRandomPrefix, V, 3);

  for (Drafter* drafter : {static_cast<Drafter*>(nullptr), static_cast<Drafter*>(&scripted)}) {
    for (const SamplingParams& sampling : {greedy(), seeded(0.9f, 1.0f, 4)}) {
      SCOPED_TRACE(
          fmt::format("{} drafter, temperature {}", drafter ? "scripted" : "MTP", sampling.temperature));
      be.downloads = be.downloads_in_step = be.synchronizes = be.uploads_outside = be.steps = 0;
      req.sampling = sampling;
      req.num_draft = 3;
      req.max_tokens = 48;
      req.drafter = drafter;
      Expected<DecodeResult> r = (*g)->generate(req);
      ASSERT_TRUE(r.has_value()) << r.status().to_string();
      EXPECT_GT(r->accept.cycles, 5);
      EXPECT_EQ(be.downloads, r->steps) << "one download per plain step and per cycle";
      EXPECT_EQ(be.downloads_in_step, 0);
      EXPECT_EQ(be.synchronizes, 0);
      EXPECT_EQ(be.uploads_outside, 0) << "every upload of the decode loop is part of a recorded step";
      EXPECT_EQ(be.depth, 0);
      // One recorded step per wait, and the one that holds the last rollback.
      EXPECT_EQ(be.steps, r->steps + 1);
      if (sampling.temperature == 0.0f && drafter != nullptr) {
        EXPECT_EQ(r->tokens, std::vector<int32_t>(plain->tokens.begin(), plain->tokens.begin() + 48));
      }
    }
  }
}

// DecodeRequest::wait_for_prefill (bench --model): one wait for the device after the prefill and before every
// wait of the decode loop, which stays one per step; the output does not change.
TEST(CycleRunner, WaitForPrefillIsOneWaitBeforeTheDecodeLoop) {
  Expected<Checkpoint> ckpt = load_checkpoint(golden::fixtures_dir() + "/qwen35-bf16");
  ASSERT_TRUE(ckpt.has_value()) << ckpt.status().to_string();
  test::CountingBackend be(create_backend({.name = "cpu", .threads = 1}).value());
  std::unique_ptr<Model> m = create_model(ckpt->config, ckpt->weights, be, {.max_rows = 16}).value();
  std::unique_ptr<Generator> g =
      Generator::create(*m, {.ctx_size = 256, .kv_dtype = DType::kF32, .max_draft = 4, .mtp = true}).value();
  DecodeRequest req;
  req.prompt = iota_from(3, 40);
  req.sampling = greedy();
  req.max_tokens = 12;
  req.num_draft = 2;
  std::vector<int32_t> tokens[2];
  for (const bool wait : {false, true}) {
    req.wait_for_prefill = wait;
    be.downloads = be.synchronizes = 0;
    be.downloads_at_synchronize = -1;
    Expected<DecodeResult> r = g->generate(req);
    ASSERT_TRUE(r.has_value()) << r.status().to_string();
    EXPECT_EQ(be.synchronizes, wait ? 1 : 0);
    if (wait) {
      EXPECT_EQ(be.downloads - be.downloads_at_synchronize, r->steps) << "after the prefill";
    }
    tokens[wait ? 1 : 0] = r->tokens;
  }
  EXPECT_EQ(tokens[0], tokens[1]);
}

}  // namespace
}  // namespace pd::exactness
