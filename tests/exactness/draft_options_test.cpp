// The MTP head's draft-side options (docs/DESIGN.md §4.8) change the drafts and never the output: with the
// head's lm_head over ids [0, N) and its attention over the last W positions, greedy and seeded generation
// with MTP cycles emit exactly the tokens of plain decoding on a model without the options, on every fixture
// with an MTP head. And the options do what they say: every draft is below N (and without the option some
// are not), the head's logits below N are bitwise the full head's and -inf above, and with the window the
// head never reads the cache before it (NaN there changes nothing) while it does change the logits once the
// context is longer than W.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>

#include "exactness/generator_test_util.h"
#include "puredrive/decode/mtp_drafter.h"

namespace pd::exactness {
namespace {

const int kTokens = full_or(96, 24);

std::unique_ptr<Model> make_model(golden::Fixture& fx, int draft_vocab, int window) {
  Expected<std::unique_ptr<Model>> m = create_model(
      fx.ckpt.config, fx.ckpt.weights, *fx.backend,
      {.max_rows = 16, .max_logit_rows = 0, .mtp_draft_vocab = draft_vocab, .mtp_window = window});
  PD_ASSERT(m.has_value(), "{}", m.status().to_string());
  return std::move(m).value();
}

std::unique_ptr<Generator> make_generator(Model& m) {
  Expected<std::unique_ptr<Generator>> g =
      Generator::create(m, {.ctx_size = 512, .kv_dtype = DType::kF32, .max_draft = 4, .mtp = true});
  PD_ASSERT(g.has_value(), "{}", g.status().to_string());
  return std::move(g).value();
}

// The MTP head, recording the largest draft it drew (the drafts stay on the device: read back here).
class RecordingDrafter final : public Drafter {
 public:
  explicit RecordingDrafter(Model& m) : head_(std::move(MtpDrafter::create(m)).value()) {}
  void reset() override { head_->reset(); }
  Status observe(SequenceState& st, int first, std::span<const int32_t> next, const Tensor& hidden) override {
    return head_->observe(st, first, next, hidden);
  }
  bool can_draft(int64_t n) const override { return head_->can_draft(n); }
  Status draft(SequenceState& st, const DraftContext& ctx, DraftBlock* out) override {
    PD_TRY(head_->draft(st, ctx, out));
    PD_ASSIGN_OR_RETURN(std::vector<int32_t> d, ctx.sampler->download_drafts(ctx.num_draft));
    for (int32_t t : d) largest = std::max(largest, t);
    return Status::ok();
  }
  int32_t largest = -1;

 private:
  std::unique_ptr<MtpDrafter> head_;
};

class DraftOptions : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (skip_in_reduced_run(GetParam())) GTEST_SKIP() << "reduced (unoptimized) build";
    Expected<std::unique_ptr<golden::Fixture>> fx = golden::Fixture::open(GetParam(), 1, 16);
    ASSERT_TRUE(fx.has_value()) << fx.status().to_string();
    fx_ = std::move(*fx);
    if (!fx_->model->has_mtp()) GTEST_SKIP() << GetParam() << " has no MTP head";
  }
  std::unique_ptr<golden::Fixture> fx_;
};

TEST_P(DraftOptions, OutputUnchangedDraftsRestricted) {
  const int V = fx_->config().vocab_size;
  const int N = V / 4;
  std::unique_ptr<Model> full = make_model(*fx_, 0, 0), cut = make_model(*fx_, N, 8);
  std::unique_ptr<Generator> plain_gen = make_generator(*full), spec_gen = make_generator(*cut),
                             full_gen = make_generator(*full);
  RecordingDrafter cut_head(*cut), full_head(*full);
  // The trained tiny coder is 30x a random fixture: its longest prompt and K = 2 only.
  const bool big = GetParam() == "tiny-coder";
  for (size_t pi = big ? fx_->prompts.size() - 1 : 0; pi < fx_->prompts.size(); ++pi) {
    const std::vector<int32_t> prompt = fx_->ref_ints(fx_->prompts[pi] + ".input_ids");
    for (const SamplingParams& sampling : {greedy(), seeded(0.8f, 0.9f, 5)}) {
      SCOPED_TRACE(fmt::format("{} prompt of {} tokens, temperature {}", GetParam(), prompt.size(),
                               sampling.temperature));
      DecodeRequest req;
      req.prompt = prompt;
      req.sampling = sampling;
      req.max_tokens = kTokens;
      Expected<DecodeResult> plain = plain_gen->generate(req);
      ASSERT_TRUE(plain.has_value()) << plain.status().to_string();
      for (int k = big ? 2 : 1; k <= (big ? 2 : 3); ++k) {
        req.num_draft = k;
        req.drafter = &cut_head;
        Expected<DecodeResult> spec = spec_gen->generate(req);
        ASSERT_TRUE(spec.has_value()) << spec.status().to_string();
        EXPECT_EQ(spec->tokens, plain->tokens) << "K=" << k;
        EXPECT_GT(spec->accept.cycles, 0) << "K=" << k;
        if (big) std::printf("tiny coder, draft vocabulary %d, window 8: %s\n", N, spec->summary().c_str());
      }
      req.num_draft = 2;
      req.drafter = &full_head;
      Expected<DecodeResult> whole = full_gen->generate(req);
      ASSERT_TRUE(whole.has_value()) << whole.status().to_string();
      if (big) std::printf("tiny coder, the whole head: %s\n", whole->summary().c_str());
    }
  }
  EXPECT_GE(cut_head.largest, 0);
  EXPECT_LT(cut_head.largest, N) << "a draft outside the draft vocabulary";
  EXPECT_GE(full_head.largest, N)
      << "without the option the head drafts above N too (else this test sees nothing)";
}

// Runs the prompt through the target (decode kernels, max_rows at a time) and the head over every row:
// returns the head's logits of the last row and its hidden state.
struct HeadRun {
  std::vector<float> logits;
  SequenceState state;
};
HeadRun run_head(Model& m, std::span<const int32_t> prompt, int32_t next) {
  Expected<SequenceState> st = m.new_state({.ctx_size = 256, .kv_dtype = DType::kF32, .max_rows = 8});
  PD_ASSERT(st.has_value(), "{}", st.status().to_string());
  std::vector<int32_t> tokens(prompt.begin() + 1, prompt.end());
  tokens.push_back(next);
  const int n = static_cast<int>(prompt.size());
  HeadRun out{.logits = {}, .state = std::move(*st)};
  for (int begin = 0; begin < n; begin += m.max_rows()) {
    const int rows = std::min(m.max_rows(), n - begin);
    std::vector<int32_t> pos(static_cast<size_t>(rows));
    std::iota(pos.begin(), pos.end(), begin);
    Expected<StepOutput> o = m.forward(out.state, prompt.subspan(static_cast<size_t>(begin), rows), pos,
                                       {.logits = LogitRows::kNone, .tap = {}});
    PD_ASSERT(o.has_value(), "{}", o.status().to_string());
    Expected<StepOutput> h =
        m.mtp_forward(out.state, std::span(tokens).subspan(static_cast<size_t>(begin), rows), pos, o->hidden,
                      {.logits = LogitRows::kLast, .tap = {}});
    PD_ASSERT(h.has_value(), "{}", h.status().to_string());
    if (begin + rows == n) {
      out.logits.resize(static_cast<size_t>(h->logits.cols));
      PD_ASSERT(m.backend().download(out.logits.data(), h->logits).is_ok());
    }
  }
  return out;
}

TEST_P(DraftOptions, HeadLogitsUnderTheOptions) {
  const int V = fx_->config().vocab_size;
  const int N = V / 4, W = 8;
  std::unique_ptr<Model> full = make_model(*fx_, 0, 0), cut = make_model(*fx_, N, 0),
                         windowed = make_model(*fx_, 0, W);
  const std::vector<int32_t> longest = fx_->ref_ints(fx_->prompts.back() + ".input_ids");
  ASSERT_GT(static_cast<int>(longest.size()), 4 * W);
  const int32_t next = 3;

  // Draft vocabulary: the first N logits are the full head's, bit for bit; the rest -inf.
  const HeadRun f = run_head(*full, longest, next), c = run_head(*cut, longest, next);
  ASSERT_EQ(c.logits.size(), f.logits.size());
  EXPECT_EQ(std::memcmp(c.logits.data(), f.logits.data(), static_cast<size_t>(N) * sizeof(float)), 0);
  for (int t = N; t < V; ++t)
    ASSERT_EQ(c.logits[static_cast<size_t>(t)], -std::numeric_limits<float>::infinity());

  // Window: a context within W gives the full head's bits; a longer one differs.
  const std::span<const int32_t> short_prompt = std::span(longest).first(static_cast<size_t>(W - 1));
  EXPECT_EQ(run_head(*windowed, short_prompt, next).logits, run_head(*full, short_prompt, next).logits);
  HeadRun w = run_head(*windowed, longest, next);
  EXPECT_NE(w.logits, f.logits) << "the window changed nothing over " << longest.size() << " positions";

  // ... and never reads before the window: NaN in those cache entries leaves the next row's logits as they
  // were.
  const int n = static_cast<int>(longest.size());
  HeadRun clean = run_head(*windowed, longest, next);
  const KvCache kv = w.state.mtp_kv(0);
  const int stale = n + 1 - W;  // the next row (position n) attends [n + 1 - W, n]
  const std::vector<float> nan(static_cast<size_t>(stale * kv.k.cols), std::nanf(""));
  ASSERT_TRUE(fx_->backend->upload(kv.k.row_slice(0, stale), nan.data()).is_ok());
  ASSERT_TRUE(fx_->backend->upload(kv.v.row_slice(0, stale), nan.data()).is_ok());
  auto next_row = [&](HeadRun& r) {
    Expected<Buffer> hidden = fx_->backend->alloc(DType::kF32, 1, fx_->config().hidden_size);
    PD_ASSERT(hidden.has_value());
    const int32_t tok = 5, pos = n;
    Expected<StepOutput> o = windowed->mtp_forward(r.state, std::span(&tok, 1), std::span(&pos, 1),
                                                   hidden->tensor(), {.logits = LogitRows::kLast, .tap = {}});
    PD_ASSERT(o.has_value(), "{}", o.status().to_string());
    return fx_->download(o->logits);
  };
  const std::vector<float> with_nan = next_row(w), without = next_row(clean);
  ASSERT_TRUE(std::all_of(with_nan.begin(), with_nan.end(), [](float x) { return std::isfinite(x); }));
  EXPECT_EQ(std::memcmp(with_nan.data(), without.data(), without.size() * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DraftOptions, ::testing::ValuesIn(golden::fixture_names()),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string n = p.param;
                           for (char& ch : n) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace pd::exactness
