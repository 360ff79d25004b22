// The generator's stop conditions and request checks (decode/generator.h): a full context ends with
// kContextFull after exactly the tokens that fit (MTP cycles shrink k near the end and emit what plain
// decoding emits), cancellation, max_tokens 0, and bad requests as errors that say what is wrong.
#include <fmt/format.h>

#include "exactness/generator_test_util.h"
#include "puredrive/decode/model_defaults.h"

namespace pd::exactness {
namespace {

constexpr const char* kFixture = "qwen35-text-f32";

TEST(GeneratorStops, ContextFullEndsAtTheContextSize) {
  std::unique_ptr<GeneratorFixture> g = GeneratorFixture::open(kFixture, /*ctx_size=*/24);
  ASSERT_NE(g, nullptr);
  const std::vector<int32_t> prompt = g->prompts()[1];  // 7 tokens: 17 fit
  for (int k : {0, 1, 4}) {
    DecodeRequest r;
    r.prompt = prompt;
    r.sampling = greedy();
    r.max_tokens = 100;
    r.num_draft = k;
    Expected<DecodeResult> out = g->gen->generate(r);
    ASSERT_TRUE(out.has_value()) << out.status().to_string();
    EXPECT_EQ(out->reason, FinishReason::kContextFull) << "k=" << k;
    EXPECT_EQ(out->tokens.size(), 24u - prompt.size()) << "k=" << k;
    EXPECT_EQ(g->gen->state().length(), 23);
  }
}

TEST(GeneratorStops, LengthStopAndCancel) {
  std::unique_ptr<GeneratorFixture> g = GeneratorFixture::open(kFixture);
  ASSERT_NE(g, nullptr);
  DecodeRequest r;
  r.prompt = g->prompts()[1];
  r.sampling = greedy();
  r.num_draft = 3;
  r.max_tokens = 0;
  Expected<DecodeResult> none = g->gen->generate(r);
  ASSERT_TRUE(none.has_value());
  EXPECT_TRUE(none->tokens.empty());
  EXPECT_EQ(none->reason, FinishReason::kLength);

  r.max_tokens = 30;
  int polls = 0;
  r.cancelled = [&polls] { return ++polls > 3; };
  Expected<DecodeResult> cancelled = g->gen->generate(r);
  ASSERT_TRUE(cancelled.has_value());
  EXPECT_EQ(cancelled->reason, FinishReason::kCancelled);
  EXPECT_LT(cancelled->tokens.size(), 30u);

  // Chunks seen by the sink add up to the result; the stop token is the last one.
  r.cancelled = nullptr;
  Expected<DecodeResult> free_run = g->gen->generate(r);
  ASSERT_TRUE(free_run.has_value());
  r.stop_token_ids = {free_run->tokens[12]};
  std::vector<int32_t> streamed;
  Expected<DecodeResult> stopped = g->gen->generate(r, [&](const DecodeChunk& c) {
    streamed.insert(streamed.end(), c.tokens.begin(), c.tokens.end());
    return true;
  });
  ASSERT_TRUE(stopped.has_value());
  EXPECT_EQ(stopped->reason, FinishReason::kStop);
  EXPECT_EQ(stopped->tokens, streamed);
  EXPECT_EQ(stopped->tokens.back(), free_run->tokens[12]);
  EXPECT_LE(stopped->tokens.size(), 13u);
}

TEST(GeneratorStops, BadRequestsAreErrors) {
  std::unique_ptr<GeneratorFixture> g = GeneratorFixture::open(kFixture, 64);
  ASSERT_NE(g, nullptr);
  auto error_of = [&](const DecodeRequest& r) {
    Expected<DecodeResult> out = g->gen->generate(r);
    return out.has_value() ? std::string("no error") : out.status().message();
  };
  DecodeRequest ok;
  ok.prompt = {1, 2, 3};
  ok.sampling = greedy();
  ok.max_tokens = 4;
  DecodeRequest r = ok;
  r.prompt = {};
  EXPECT_NE(error_of(r).find("prompt is empty"), std::string::npos);
  r = ok;
  r.prompt = {1, 256};
  EXPECT_NE(error_of(r).find("outside the vocabulary"), std::string::npos);
  r = ok;
  r.prompt.assign(64, 1);
  EXPECT_NE(error_of(r).find("no room"), std::string::npos);
  r = ok;
  r.num_draft = 5;
  EXPECT_NE(error_of(r).find("0..4"), std::string::npos);
  r = ok;
  r.sampling.temperature = 1.0f;
  r.rule = AcceptRule::kGreedy;
  EXPECT_NE(error_of(r).find("temperature 0"), std::string::npos);
  r = ok;
  r.sampling.temperature = 1.0f;
  r.rule = AcceptRule::kSeeded;
  EXPECT_NE(error_of(r).find("needs a seed"), std::string::npos);
  r = ok;
  r.sampling.top_p = 1.5f;
  EXPECT_NE(error_of(r).find("top_p"), std::string::npos);
  EXPECT_EQ(error_of(ok), "no error");
}

}  // namespace
}  // namespace pd::exactness

namespace pd::exactness {
namespace {

TEST(GenerationDefaults, EosIdsAndSamplingFromTheModelDirectory) {
  const std::string coder = std::string(PD_SOURCE_DIR) + "/models/tiny-coder";
  Expected<Tokenizer> tok = Tokenizer::load(coder);
  ASSERT_TRUE(tok.has_value());
  Expected<GenerationDefaults> d = load_generation_defaults(coder, &*tok);
  ASSERT_TRUE(d.has_value()) << d.status().to_string();
  // generation_config.json [8185, 8183] and tokenizer_config.json's eos_token <|im_end|> (8185).
  EXPECT_EQ(d->eos_token_ids, (std::vector<int32_t>{8183, 8185}));
  const SamplingParams sp = d->sampling();  // do_sample true, temperature 0.6, top_k 20, top_p 0.95
  EXPECT_FLOAT_EQ(sp.temperature, 0.6f);
  EXPECT_EQ(sp.top_k, 20);
  EXPECT_FLOAT_EQ(sp.top_p, 0.95f);

  Expected<GenerationDefaults> f =
      load_generation_defaults(std::string(PD_SOURCE_DIR) + "/tests/fixtures/qwen35-smallvocab-f32", nullptr);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->eos_token_ids, (std::vector<int32_t>{47}));
  EXPECT_EQ(f->sampling().temperature, 0.0f);  // do_sample false: greedy

  Expected<GenerationDefaults> none = load_generation_defaults("/nonexistent-model-dir", nullptr);
  ASSERT_TRUE(none.has_value());
  EXPECT_TRUE(none->eos_token_ids.empty());
}

}  // namespace
}  // namespace pd::exactness
