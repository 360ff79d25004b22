// The MTP drafter against the fixtures' reference MTP chain (tools/reference/mtp_reference.py, FORMAT.md):
// after the prompt's rows are observed (token x_{i+1}, the target's final hidden at i) and the greedy token
// is appended, drafting k tokens greedily gives the reference chain tokens, and the draft logits of every
// chain step match the reference logits within the fixture's tolerance. The rows are observed in prefill
// chunks and one at a time, as plain decode steps observe them (then the head runs every
// MtpDrafter::kPendingRows rows, so that no more are ever pending).
#include <fmt/format.h>

#include <numeric>

#include "exactness/generator_test_util.h"
#include "puredrive/decode/mtp_drafter.h"

namespace pd::exactness {
namespace {

class MtpDrafterReference : public ::testing::TestWithParam<std::string> {};

TEST_P(MtpDrafterReference, ChainMatchesTheReference) {
  Expected<std::unique_ptr<golden::Fixture>> fx_or = golden::Fixture::open(GetParam(), 1, 16);
  ASSERT_TRUE(fx_or.has_value()) << fx_or.status().to_string();
  golden::Fixture& fx = **fx_or;
  Expected<std::unique_ptr<MtpDrafter>> drafter = MtpDrafter::create(*fx.model);
  ASSERT_TRUE(drafter.has_value()) << drafter.status().to_string();
  const int V = fx.config().vocab_size;
  for (const int step_rows : {fx.model->max_rows(), 1})
    for (const std::string& p : fx.prompts) {
      SCOPED_TRACE(fmt::format("{} {}, {} rows per step", GetParam(), p, step_rows));
      const std::vector<int32_t> prompt = fx.ref_ints(p + ".input_ids");
      const std::vector<int32_t> greedy = fx.ref_ints(p + ".greedy");
      const std::vector<int32_t> chain = fx.ref_ints(p + ".mtp.chain_tokens");
      const std::vector<float> chain_logits = fx.ref_floats(p + ".mtp.chain_logits");
      const int k = static_cast<int>(chain.size());
      SequenceState st = fx.new_state(256, DType::kF32, 8);
      (*drafter)->reset();
      std::vector<int32_t> sequence = prompt;
      sequence.push_back(greedy[0]);
      // The prompt through the target in chunks; every row's next token is known (the last one's is
      // greedy[0]).
      const int T = static_cast<int>(prompt.size());
      for (int begin = 0; begin < T; begin += step_rows) {
        const int rows = std::min(step_rows, T - begin);
        std::vector<int32_t> pos(static_cast<size_t>(rows));
        std::iota(pos.begin(), pos.end(), begin);
        Expected<StepOutput> o =
            fx.model->forward(st, std::span(prompt).subspan(static_cast<size_t>(begin), rows), pos,
                              {.logits = LogitRows::kNone, .tap = {}});
        ASSERT_TRUE(o.has_value()) << o.status().to_string();
        ASSERT_TRUE((*drafter)
                        ->observe(st, begin,
                                  std::span(sequence).subspan(static_cast<size_t>(begin) + 1, rows),
                                  o->hidden)
                        .is_ok());
        if (step_rows <= MtpDrafter::kPendingRows) {
          ASSERT_LE((*drafter)->pending_rows(), MtpDrafter::kPendingRows);
        }
      }
      ASSERT_TRUE((*drafter)->can_draft(T));
      SamplingParams params;  // temperature 1, no truncation: the q rows are the raw draft logits
      params.temperature = 1.0f;
      Expected<std::unique_ptr<DeviceSampler>> sampler = DeviceSampler::create(fx.model->backend(), V);
      ASSERT_TRUE(sampler.has_value()) << sampler.status().to_string();
      ASSERT_TRUE((*sampler)->begin(params, params, prompt).is_ok());
      Rng rng(1);
      const DraftContext ctx{.sequence = sequence,
                             .prompt_length = T,
                             .num_draft = k,
                             .rule = AcceptRule::kGreedy,
                             .sampler = sampler->get(),
                             .rng = &rng,
                             .seed = 0,
                             .keep_logits = true};
      DraftBlock block;
      ASSERT_TRUE((*drafter)->draft(st, ctx, &block).is_ok());
      EXPECT_TRUE(block.on_device);
      const Expected<std::vector<int32_t>> drafts = (*sampler)->download_drafts(k);
      ASSERT_TRUE(drafts.has_value()) << drafts.status().to_string();
      EXPECT_EQ(*drafts, chain);
      const Expected<Tensor> rows = (*sampler)->draft_rows(k);
      ASSERT_TRUE(rows.has_value()) << rows.status().to_string();
      std::vector<float> draft_logits(static_cast<size_t>(k) * static_cast<size_t>(V));
      ASSERT_TRUE(fx.model->backend().download(draft_logits.data(), *rows).is_ok());
      for (int j = 0; j < k; ++j) {
        const std::vector<float> want(chain_logits.begin() + static_cast<ptrdiff_t>(j) * V,
                                      chain_logits.begin() + static_cast<ptrdiff_t>(j + 1) * V);
        const std::vector<float> got(draft_logits.begin() + static_cast<ptrdiff_t>(j) * V,
                                     draft_logits.begin() + static_cast<ptrdiff_t>(j + 1) * V);
        const double err = golden::rel_err(got, want);
        EXPECT_LE(err, fx.tolerance) << "draft logits of chain step " << j + 1;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MtpDrafterReference, ::testing::ValuesIn(golden::fixture_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string s = i.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace pd::exactness
