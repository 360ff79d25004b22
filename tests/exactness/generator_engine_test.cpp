// The server's engine port over the generator (src/cli/generator_engine.h) on the bundled tiny coder, which
// has a tokenizer: the tokens equal a plain generator run's, the text equals the tokenizer's decode of them
// (a final stop token counted but not shown), speculative statistics are reported, and the port's stop,
// length and cancel rules hold.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/generator_engine.h"
#include "golden/fixture_util.h"
#include "puredrive/decode/generator.h"
#include "puredrive/tokenizer/tokenizer.h"

namespace pd {
namespace {

struct Collect : server::GenerationSink {
  std::vector<int32_t> ids;
  std::string text;
  std::vector<server::TokenLogprob> logprobs;
  int outputs = 0;
  int stop_after = -1;  // cancel once this many tokens arrived
  bool on_output(server::GenerationOutput out) override {
    ++outputs;
    ids.insert(ids.end(), out.token_ids.begin(), out.token_ids.end());
    text += out.text;
    logprobs.insert(logprobs.end(), out.logprobs.begin(), out.logprobs.end());
    return stop_after < 0 || static_cast<int>(ids.size()) < stop_after;
  }
  bool cancelled() const override { return false; }
};

struct EngineFixture : ::testing::Test {
  void SetUp() override {
    const std::string dir = std::string(PD_SOURCE_DIR) + "/models/tiny-coder";
    Expected<std::unique_ptr<golden::Fixture>> fx = golden::Fixture::open("tiny-coder", 1, 64);
    ASSERT_TRUE(fx.has_value()) << fx.status().to_string();
    fx_ = std::move(*fx);
    Expected<Tokenizer> tok = Tokenizer::load(dir);
    ASSERT_TRUE(tok.has_value()) << tok.status().to_string();
    tok_ = std::move(*tok);
    Expected<std::unique_ptr<Generator>> gen = Generator::create(
        *fx_->model, {.ctx_size = 256, .kv_dtype = DType::kBF16, .max_draft = 4, .mtp = true});
    ASSERT_TRUE(gen.has_value());
    Expected<std::unique_ptr<Generator>> ref = Generator::create(
        *fx_->model, {.ctx_size = 256, .kv_dtype = DType::kBF16, .max_draft = 4, .mtp = false});
    ASSERT_TRUE(ref.has_value());
    reference_ = std::move(*ref);
    engine_ = std::make_unique<cli::GeneratorEngine>(
        std::move(*gen), *tok_,
        server::EngineInfo{
            .model_id = "tiny", .context_size = 256, .vocab_size = 8192, .mtp_draft = 3, .backend = "cpu"},
        3);
    Expected<std::vector<int32_t>> ids = tok_->encode("def parse_args(argv):\n");
    ASSERT_TRUE(ids.has_value());
    prompt_ = *ids;
  }

  std::vector<int32_t> plain(int n, const std::vector<int32_t>& stops = {}) {
    DecodeRequest r;
    r.prompt = prompt_;
    r.sampling.temperature = 0.0f;
    r.max_tokens = n;
    r.stop_token_ids = stops;
    Expected<DecodeResult> out = reference_->generate(r);
    EXPECT_TRUE(out.has_value());
    return out ? out->tokens : std::vector<int32_t>{};
  }

  server::GenerationRequest request(int n) const {
    server::GenerationRequest r;
    r.id = "test";
    r.prompt_ids = prompt_;
    r.sampling.temperature = 0.0f;
    r.max_tokens = n;
    return r;
  }

  std::unique_ptr<golden::Fixture> fx_;
  std::optional<Tokenizer> tok_;
  std::unique_ptr<Generator> reference_;
  std::unique_ptr<cli::GeneratorEngine> engine_;
  std::vector<int32_t> prompt_;
};

TEST_F(EngineFixture, GreedyTokensAndTextEqualPlainDecoding) {
  const std::vector<int32_t> want = plain(80);
  Collect sink;
  const server::GenerationResult r = engine_->generate(request(80), sink);
  EXPECT_EQ(r.reason, server::FinishReason::kLength) << r.error;
  EXPECT_EQ(sink.ids, want);
  EXPECT_EQ(sink.text, tok_->decode(want));
  EXPECT_EQ(r.stats.prompt_tokens, static_cast<int32_t>(prompt_.size()));
  EXPECT_EQ(r.stats.completion_tokens, 80);
  EXPECT_GT(r.stats.draft_tokens, 0);
  EXPECT_GT(r.stats.accepted_draft_tokens, 0);  // a trained MTP head drafts tokens the trunk accepts
  EXPECT_LT(r.stats.decode_steps, 80);          // so there are fewer target steps than tokens
  EXPECT_LT(sink.outputs, 80);
  EXPECT_EQ(engine_->info().mtp_draft, 3);
}

TEST_F(EngineFixture, StopTokenIsCountedButNotShown) {
  const std::vector<int32_t> free_run = plain(40);
  const int32_t stop = free_run[20];
  const std::vector<int32_t> want = plain(40, {stop});
  ASSERT_EQ(want.back(), stop);
  server::GenerationRequest req = request(40);
  req.stop_token_ids = {stop};
  Collect sink;
  const server::GenerationResult r = engine_->generate(req, sink);
  EXPECT_EQ(r.reason, server::FinishReason::kStop);
  EXPECT_EQ(sink.ids, want);
  EXPECT_EQ(r.stats.completion_tokens, static_cast<int32_t>(want.size()));
  EXPECT_EQ(sink.text, tok_->decode(std::span(want).first(want.size() - 1)));
}

TEST_F(EngineFixture, SinkRefusalCancels) {
  Collect sink;
  sink.stop_after = 5;
  const server::GenerationResult r = engine_->generate(request(60), sink);
  EXPECT_EQ(r.reason, server::FinishReason::kCancelled);
  EXPECT_GE(sink.ids.size(), 5u);
  EXPECT_LE(sink.ids.size(), 5u + 3u);  // at most the rest of one cycle
}

TEST_F(EngineFixture, SeededSamplingIsReproducibleAndLogprobsAreReported) {
  server::GenerationRequest req = request(30);
  req.sampling.temperature = 0.8f;
  req.sampling.top_p = 0.9f;
  req.sampling.seed = 42;
  req.logprobs = 2;
  Collect a, b;
  engine_->generate(req, a);
  engine_->generate(req, b);
  EXPECT_EQ(a.ids, b.ids);
  ASSERT_EQ(a.logprobs.size(), a.ids.size());
  for (size_t i = 0; i < a.ids.size(); ++i) {
    EXPECT_EQ(a.logprobs[i].token_id, a.ids[i]);
    EXPECT_LE(a.logprobs[i].logprob, 0.0f);
    ASSERT_EQ(a.logprobs[i].top.size(), 2u);
    EXPECT_GE(a.logprobs[i].top[0].logprob, a.logprobs[i].top[1].logprob);
    EXPECT_GE(a.logprobs[i].top[0].logprob, a.logprobs[i].logprob);
  }
}

TEST_F(EngineFixture, BadRequestIsAnErrorNotACrash) {
  server::GenerationRequest req = request(4);
  req.prompt_ids = {1, 999999};
  Collect sink;
  const server::GenerationResult r = engine_->generate(req, sink);
  EXPECT_EQ(r.reason, server::FinishReason::kError);
  EXPECT_NE(r.error.find("outside the vocabulary"), std::string::npos) << r.error;
}

}  // namespace
}  // namespace pd
