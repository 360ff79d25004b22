// The backend's sample op, as the generator and the drafter drive it (DeviceSampler on the CPU backend),
// against the host sampler (process_logits, draw_token, Verifier::accept with a TokenHistory and an Rng):
// random decode runs where both sides draw the drafts, verify, commit and keep their own history, compared
// token for token and logprob bit for bit. The CUDA op is compared with the CPU op in tests/cuda/.
#include "puredrive/decode/device_sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "puredrive/decode/sampler.h"

namespace pd {
namespace {

struct DecodeCase {
  int vocab;
  AcceptRule rule;
  SamplingParams target, draft;
  int top_logprobs;
  bool device_drafts;  // drafts drawn by draw_draft (else picked on the host and uploaded)
};

SamplingParams random_params(std::mt19937_64& gen, bool greedy) {
  auto pick = [&](std::initializer_list<double> v) {
    return *(v.begin() + static_cast<std::ptrdiff_t>(gen() % v.size()));
  };
  SamplingParams p;
  p.temperature = greedy ? 0.0f : static_cast<float>(pick({0.05, 0.6, 1.0, 1.8}));
  p.top_k = static_cast<int32_t>(pick({0, 0, 1, 5, 40}));
  p.top_p = static_cast<float>(pick({1.0, 0.95, 0.5}));
  p.min_p = static_cast<float>(pick({0.0, 0.0, 0.05}));
  if (gen() % 2 == 0) {
    p.repetition_penalty = static_cast<float>(pick({0.9, 1.3}));
    p.presence_penalty = static_cast<float>(pick({0.0, 0.6, -0.4}));
    p.frequency_penalty = static_cast<float>(pick({0.0, 0.3}));
  }
  return p;
}

std::vector<float> random_rows(std::mt19937_64& gen, int rows, int vocab) {
  std::normal_distribution<double> normal(0.0, 1.0);
  const double scale = gen() % 2 == 0 ? 1.0 : 4.0;
  std::vector<float> z(static_cast<size_t>(rows) * vocab);
  for (float& x : z) x = static_cast<float>(std::round(scale * normal(gen) * 4.0) / 4.0);  // some ties
  return z;
}

void run(const DecodeCase& r, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "V=" << r.vocab << " rule " << accept_rule_name(r.rule) << " seed "
                                    << seed);
  std::mt19937_64 gen(seed);
  Expected<std::unique_ptr<Backend>> be = create_backend({.name = "cpu", .threads = 1});
  ASSERT_TRUE(be.has_value());
  Expected<std::unique_ptr<DeviceSampler>> ds_or = DeviceSampler::create(**be, r.vocab);
  ASSERT_TRUE(ds_or.has_value()) << ds_or.status().to_string();
  DeviceSampler& ds = **ds_or;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 12; ++i) prompt.push_back(static_cast<int32_t>(gen() % r.vocab));
  ASSERT_TRUE(ds.begin(r.target, r.draft, prompt).is_ok());
  TokenHistory history(r.vocab);
  history.add_prompt(prompt);
  Rng host_accept(seed), host_draft(seed + 1), dev_accept(seed), dev_draft(seed + 1);
  const uint64_t noise_seed = gen();
  const Verifier verifier(r.rule);
  const bool needs_q = r.rule == AcceptRule::kTokenwise || r.rule == AcceptRule::kBlock;
  int64_t position = static_cast<int64_t>(prompt.size());
  Expected<Buffer> logits_buf = (*be)->alloc(DType::kF32, 5, r.vocab);
  ASSERT_TRUE(logits_buf.has_value());
  for (int step = 0; step < 30; ++step) {
    const int k = static_cast<int>(gen() % 5);
    const std::vector<float> target_rows = random_rows(gen, k + 1, r.vocab);
    std::vector<float> draft_rows = random_rows(gen, std::max(k, 1), r.vocab);
    // Drafts: both sides draw them from the draft rows (or the host picks them and uploads).
    std::vector<int32_t> drafts;
    std::vector<TokenDistribution> q(static_cast<size_t>(k));
    Tensor rows;
    if (k > 0) {
      Expected<Tensor> t = ds.draft_rows(k);
      ASSERT_TRUE(t.has_value());
      rows = *t;
      ASSERT_TRUE((*be)->upload(rows, draft_rows.data()).is_ok());
    }
    for (int j = 0; j < k; ++j) {
      const std::span<const float> row(draft_rows.data() + static_cast<size_t>(j) * r.vocab,
                                       static_cast<size_t>(r.vocab));
      ASSERT_TRUE(process_logits(row, r.draft, &history, &q[static_cast<size_t>(j)]).is_ok());
      const int32_t host =
          draw_token(r.rule, q[static_cast<size_t>(j)], host_draft, noise_seed, position + j + 1);
      if (r.device_drafts) {
        const bool uses_u = needs_q;
        const double u = uses_u ? dev_draft.uniform() : 0.0;
        ASSERT_TRUE(ds.stage(uses_u ? std::span<const double>(&u, 1) : std::span<const double>(), noise_seed,
                             position + j + 1)
                        .is_ok());
        Expected<int32_t> dev = ds.draw_draft(rows.row_slice(j, 1), r.rule, j);
        ASSERT_TRUE(dev.has_value()) << dev.status().to_string();
        ASSERT_EQ(*dev, host) << "draft " << j + 1 << " of step " << step;
      }
      drafts.push_back(host);
      history.push(host);
    }
    for (int j = k; j > 0; --j) history.pop(drafts[static_cast<size_t>(j) - 1]);
    if (!r.device_drafts) {
      ASSERT_TRUE(ds.upload_drafts(drafts).is_ok());
    }

    // Verify on the host.
    std::vector<TokenDistribution> p(static_cast<size_t>(k) + 1);
    for (int j = 0; j <= k; ++j) {
      if (j > 0) history.push(drafts[static_cast<size_t>(j) - 1]);
      const std::span<const float> row(target_rows.data() + static_cast<size_t>(j) * r.vocab,
                                       static_cast<size_t>(r.vocab));
      ASSERT_TRUE(process_logits(row, r.target, &history, &p[static_cast<size_t>(j)]).is_ok());
    }
    for (int j = k; j > 0; --j) history.pop(drafts[static_cast<size_t>(j) - 1]);
    const AcceptResult want = verifier.accept(
        {.drafts = drafts,
         .target = p,
         .draft = needs_q ? std::span<const TokenDistribution>(q) : std::span<const TokenDistribution>(),
         .seed = noise_seed,
         .first_position = position + 1},
        host_accept);
    // ... and with the op.
    std::vector<double> uniforms;
    if (needs_q) {
      for (int j = 0; j <= k; ++j) uniforms.push_back(dev_accept.uniform());
    }
    const Tensor logits = logits_buf->row_slice(0, k + 1);
    ASSERT_TRUE((*be)->upload(logits, target_rows.data()).is_ok());
    ASSERT_TRUE(ds.stage(uniforms, noise_seed, position + 1).is_ok());
    Expected<const Verdict*> got = ds.verify(logits, rows, verifier, r.top_logprobs);
    ASSERT_TRUE(got.has_value()) << got.status().to_string();
    const Verdict& v = **got;
    ASSERT_EQ(v.accepted, want.num_accepted) << "step " << step << " k " << k;
    ASSERT_EQ(v.tokens.size(), static_cast<size_t>(want.num_accepted) + 1);
    ASSERT_EQ(v.tokens.back(), want.next_token) << "step " << step;
    for (int j = 0; j <= v.accepted; ++j) {
      const int32_t t = v.tokens[static_cast<size_t>(j)];
      if (r.top_logprobs >= 0) {
        const std::span<const float> row(target_rows.data() + static_cast<size_t>(j) * r.vocab,
                                         static_cast<size_t>(r.vocab));
        const double log_z = sampling::raw_log_normaliser(row);
        const TokenLogprobs& lp = v.logprobs[static_cast<size_t>(j)];
        EXPECT_EQ(float_bits(lp.logprob), float_bits(sampling::raw_logprob(row, log_z, t)));
        const std::vector<int32_t> top = sampling::top_logit_ids(row, r.top_logprobs);
        ASSERT_EQ(lp.top.size(), top.size());
        for (size_t i = 0; i < top.size(); ++i) {
          EXPECT_EQ(lp.top[i].first, top[i]);
          EXPECT_EQ(float_bits(lp.top[i].second), float_bits(sampling::raw_logprob(row, log_z, top[i])));
        }
      }
      history.push(t);
    }
    position += v.accepted + 1;
  }
}

TEST(DeviceSampler, MatchesTheHostSamplerOverDecodeRuns) {
  std::mt19937_64 gen(2024);
  int runs = 0;
  for (int vocab : {3, 64, 1000}) {
    for (AcceptRule rule :
         {AcceptRule::kGreedy, AcceptRule::kTokenwise, AcceptRule::kBlock, AcceptRule::kSeeded}) {
      for (int variant = 0; variant < 3; ++variant) {
        DecodeCase r{.vocab = vocab,
                     .rule = rule,
                     .target = random_params(gen, rule == AcceptRule::kGreedy),
                     .draft = {},
                     .top_logprobs = variant == 0 ? -1 : (variant == 1 ? 0 : 5),
                     .device_drafts = variant != 1};
        if (variant == 2) r.target.logit_bias = {{1, 2.0f}, {vocab - 1, -100.0f}};
        r.draft = r.target;  // as the generator: the draft side differs in temperature at most
        if (rule == AcceptRule::kTokenwise || rule == AcceptRule::kBlock) {
          r.draft.temperature = variant == 2 ? 0.0f : 1.3f;  // a colder or hotter draft side
        }
        run(r, gen());
        ++runs;
      }
    }
  }
  EXPECT_EQ(runs, 36);
}

TEST(DeviceSampler, ReportsBadRowsAndDraftsAsErrors) {
  Expected<std::unique_ptr<Backend>> be = create_backend({.name = "cpu", .threads = 1});
  ASSERT_TRUE(be.has_value());
  Expected<std::unique_ptr<DeviceSampler>> ds = DeviceSampler::create(**be, 8);
  ASSERT_TRUE(ds.has_value());
  SamplingParams sp;
  ASSERT_TRUE((*ds)->begin(sp, sp, std::vector<int32_t>{1, 2}).is_ok());
  Expected<Buffer> logits = (*be)->alloc(DType::kF32, 2, 8);
  ASSERT_TRUE(logits.has_value());
  std::vector<float> rows(16, 0.0f);
  rows[8 + 5] = std::nanf("");
  ASSERT_TRUE((*be)->upload(logits->tensor(), rows.data()).is_ok());
  ASSERT_TRUE((*ds)->upload_drafts(std::vector<int32_t>{3}).is_ok());
  ASSERT_TRUE((*ds)->stage({}, 1, 3).is_ok());
  Expected<const Verdict*> v = (*ds)->verify(logits->tensor(), Tensor{}, Verifier(AcceptRule::kSeeded), -1);
  ASSERT_FALSE(v.has_value());
  EXPECT_NE(v.status().message().find("row 1 has a NaN or +inf logit at token 5"), std::string::npos)
      << v.status().message();
  rows[8 + 5] = 0.0f;
  ASSERT_TRUE((*be)->upload(logits->tensor(), rows.data()).is_ok());
  ASSERT_TRUE((*ds)->upload_drafts(std::vector<int32_t>{9}).is_ok());
  v = (*ds)->verify(logits->tensor(), Tensor{}, Verifier(AcceptRule::kGreedy), -1);
  ASSERT_FALSE(v.has_value());
  EXPECT_NE(v.status().message().find("draft 1 is token 9, outside the vocabulary"), std::string::npos)
      << v.status().message();
}

// A cycle as the MTP drafter and the generator queue it: two greedy draws (each drafts the argmax of its row
// on the device), then the verification of those drafts, all read back by one collect(). Expected values are
// argmaxes computed here. A NaN in a draw's row is reported by that collect().
TEST(DeviceSampler, QueuedDrawsAndVerifyCollectOnce) {
  Expected<std::unique_ptr<Backend>> be = create_backend({.name = "cpu", .threads = 1});
  ASSERT_TRUE(be.has_value());
  constexpr int V = 16;
  Expected<std::unique_ptr<DeviceSampler>> ds = DeviceSampler::create(**be, V);
  ASSERT_TRUE(ds.has_value());
  SamplingParams sp;
  sp.temperature = 0.0f;
  ASSERT_TRUE((*ds)->begin(sp, sp, {}).is_ok());
  Expected<Buffer> draws = (*be)->alloc(DType::kF32, 2, V), target = (*be)->alloc(DType::kF32, 3, V);
  ASSERT_TRUE(draws.has_value() && target.has_value());
  std::mt19937_64 gen(9);
  std::vector<float> d = random_rows(gen, 2, V), t = random_rows(gen, 3, V);
  auto argmax = [&](const std::vector<float>& rows, int r) {
    const float* x = rows.data() + static_cast<ptrdiff_t>(r) * V;
    return static_cast<int32_t>(std::max_element(x, x + V) - x);  // the first maximum: the lowest id
  };
  // Make the target agree with the first draft only.
  t[static_cast<size_t>(argmax(d, 0))] = 100.0f;
  t[V + static_cast<size_t>((argmax(d, 1) + 1) % V)] = 100.0f;
  ASSERT_TRUE((*be)->upload(draws->tensor(), d.data()).is_ok());
  ASSERT_TRUE((*be)->upload(target->tensor(), t.data()).is_ok());
  for (int j = 0; j < 2; ++j) {
    ASSERT_TRUE((*ds)->stage({}, 0, 10 + j).is_ok());
    ASSERT_TRUE((*ds)->queue_draft(draws->row_slice(j, 1), AcceptRule::kGreedy, j).is_ok());
  }
  ASSERT_TRUE((*ds)->stage({}, 0, 10).is_ok());
  ASSERT_TRUE((*ds)->queue_verify(target->tensor(), Tensor{}, Verifier(AcceptRule::kGreedy), -1).is_ok());
  Expected<const Verdict*> v = (*ds)->collect();
  ASSERT_TRUE(v.has_value()) << v.status().to_string();
  EXPECT_EQ((*v)->accepted, 1);
  EXPECT_EQ((*v)->tokens, (std::vector<int32_t>{argmax(d, 0), argmax(t, 1)}));
  EXPECT_EQ(*(*ds)->download_drafts(2), (std::vector<int32_t>{argmax(d, 0), argmax(d, 1)}));

  d[V + 3] = std::nanf("");
  ASSERT_TRUE((*be)->upload(draws->tensor(), d.data()).is_ok());
  for (int j = 0; j < 2; ++j)
    ASSERT_TRUE((*ds)->queue_draft(draws->row_slice(j, 1), AcceptRule::kGreedy, j).is_ok());
  ASSERT_TRUE((*ds)->queue_verify(target->tensor(), Tensor{}, Verifier(AcceptRule::kGreedy), -1).is_ok());
  v = (*ds)->collect();
  ASSERT_FALSE(v.has_value());
  EXPECT_NE(v.status().message().find("NaN or +inf logit at token 3"), std::string::npos)
      << v.status().message();
  EXPECT_FALSE((*ds)->collect().has_value()) << "nothing queued any more";
}

}  // namespace
}  // namespace pd
