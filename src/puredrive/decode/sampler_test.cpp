// Sampler tests: SamplingParams validation, and every processing stage against a naive reference written
// the way HF / vLLM describe it (normalise, full sort, ascending cumulative sum for top-p).
#include "puredrive/decode/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "puredrive/decode/chi_square.h"
#include "puredrive/util/mapped_file.h"

namespace pd {
namespace {

// ---- naive reference -------------------------------------------------------------------------------------

struct NaiveHistory {
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
};

std::vector<float> naive_penalised(std::vector<float> z, const SamplingParams& sp, const NaiveHistory& h) {
  for (const auto& [t, b] : sp.logit_bias) z[t] += b;
  for (int32_t t = 0; t < static_cast<int32_t>(z.size()); ++t) {
    const bool in_prompt = std::count(h.prompt.begin(), h.prompt.end(), t) > 0;
    const auto count = static_cast<int32_t>(std::count(h.output.begin(), h.output.end(), t));
    if (in_prompt || count > 0) {
      // HF RepetitionPenaltyLogitsProcessor: where(score < 0, score * r, score / r).
      z[t] = z[t] < 0 ? z[t] * sp.repetition_penalty : z[t] / sp.repetition_penalty;
    }
    if (count > 0) {
      z[t] -= sp.frequency_penalty * static_cast<float>(count);
      z[t] -= sp.presence_penalty;
    }
  }
  return z;
}

// Returns the final probabilities (0 = masked), computed with normalised probabilities at every stage.
std::vector<double> naive_probs(const std::vector<float>& z, const SamplingParams& sp) {
  const size_t n = z.size();
  std::vector<double> p(n);
  if (sp.temperature == 0.0f) {
    const size_t best = std::max_element(z.begin(), z.end()) - z.begin();  // first max = lowest id
    p[best] = 1.0;
    return p;
  }
  const double m = *std::max_element(z.begin(), z.end());
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += p[i] = std::exp((z[i] - m) / sp.temperature);
  for (double& x : p) x /= sum;
  // min_p (vLLM): mask p < min_p * max p.
  const double pmax = *std::max_element(p.begin(), p.end());
  for (double& x : p) {
    if (x < sp.min_p * pmax) x = 0;
  }
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  if (sp.top_k > 0) {
    for (size_t r = sp.top_k; r < n; ++r) p[order[r]] = 0;
  }
  if (sp.top_p < 1.0f) {
    double s = 0;
    for (double x : p) s += x;
    for (double& x : p) x /= s;
    // HF TopPLogitsWarper: ascending sort, remove cumsum <= 1 - top_p, always keep the most likely.
    double cum = 0;
    for (size_t r = n; r-- > 0;) {
      const size_t t = order[r];
      if (p[t] == 0) continue;
      cum += p[t];
      if (cum <= 1.0 - sp.top_p && r != 0) p[t] = 0;
    }
  }
  double s = 0;
  for (double x : p) s += x;
  for (double& x : p) x /= s;
  return p;
}

std::vector<float> random_logits(std::mt19937_64& gen, int vocab, double scale) {
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<float> z(vocab);
  for (float& x : z) x = static_cast<float>(normal(gen));
  return z;
}

void expect_matches_naive(const std::vector<float>& logits, const SamplingParams& sp,
                          const std::string& what) {
  TokenDistribution d;
  ASSERT_TRUE(process_logits(logits, sp, nullptr, &d).is_ok());
  const std::vector<double> ref = naive_probs(logits, sp);
  std::vector<int32_t> ref_kept;
  for (int32_t t = 0; t < static_cast<int32_t>(ref.size()); ++t) {
    if (ref[t] > 0) ref_kept.push_back(t);
  }
  ASSERT_EQ(d.kept, ref_kept) << what;
  double sum = 0;
  for (int32_t t = 0; t < static_cast<int32_t>(ref.size()); ++t) {
    ASSERT_NEAR(d.probs[t], ref[t], 1e-12 + 1e-9 * ref[t]) << what << " token " << t;
    sum += d.probs[t];
  }
  EXPECT_NEAR(sum, 1.0, 1e-12) << what;
}

// ---- SamplingParams --------------------------------------------------------------------------------------

TEST(SamplingParams, DefaultsAreValid) {
  EXPECT_TRUE(SamplingParams{}.validate(100).is_ok());
}

TEST(SamplingParams, ValidateNamesFieldRangeAndValue) {
  const auto message = [](auto mutate) {
    SamplingParams sp;
    mutate(sp);
    const Status s = sp.validate(100);
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
    return s.message();
  };
  EXPECT_EQ(message([](SamplingParams& s) { s.top_p = 1.5f; }), "top_p must be in (0, 1], got 1.5");
  EXPECT_EQ(message([](SamplingParams& s) { s.top_p = 0.0f; }), "top_p must be in (0, 1], got 0");
  EXPECT_EQ(message([](SamplingParams& s) { s.temperature = -0.5f; }),
            "temperature must be a finite number >= 0 (0 = greedy), got -0.5");
  EXPECT_EQ(message([](SamplingParams& s) { s.temperature = NAN; }),
            "temperature must be a finite number >= 0 (0 = greedy), got nan");
  EXPECT_EQ(message([](SamplingParams& s) { s.top_k = -1; }), "top_k must be >= 0 (0 = off), got -1");
  EXPECT_EQ(message([](SamplingParams& s) { s.min_p = 1.25f; }), "min_p must be in [0, 1], got 1.25");
  EXPECT_EQ(message([](SamplingParams& s) { s.repetition_penalty = 0.0f; }),
            "repetition_penalty must be a finite number > 0 (1 = off), got 0");
  EXPECT_EQ(message([](SamplingParams& s) { s.presence_penalty = INFINITY; }),
            "presence_penalty must be finite, got inf");
  EXPECT_EQ(message([](SamplingParams& s) { s.logit_bias[100] = 1.0f; }),
            "logit_bias token id 100 is out of range [0, 100)");
  EXPECT_EQ(message([](SamplingParams& s) { s.logit_bias[3] = -150.0f; }),
            "logit_bias for token 3 must be in [-100, 100], got -150");
  EXPECT_EQ(message([](SamplingParams& s) {
              s.logprobs = true;
              s.top_logprobs = 21;
            }),
            "top_logprobs must be in [0, 20], got 21");
  EXPECT_EQ(message([](SamplingParams& s) { s.top_logprobs = 2; }),
            "top_logprobs (2) requires logprobs = true");
}

// ---- processing ------------------------------------------------------------------------------------------

TEST(Sampler, GreedyTiesBreakToLowestId) {
  const std::vector<float> z = {1.0f, 3.0f, -2.0f, 3.0f, 2.5f};
  SamplingParams sp;
  sp.temperature = 0.0f;
  TokenDistribution d;
  ASSERT_TRUE(process_logits(z, sp, nullptr, &d).is_ok());
  EXPECT_TRUE(d.greedy);
  EXPECT_EQ(d.argmax, 1);
  EXPECT_EQ(d.kept, std::vector<int32_t>{1});
  EXPECT_EQ(d.probs[1], 1.0);
  Rng rng(1);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(sample(d, rng), 1);
  EXPECT_EQ(sample_seeded(d, 7, 3), 1);
}

TEST(Sampler, TemperatureZeroIgnoresTruncationAndMatchesLowTemperatureMode) {
  std::mt19937_64 gen(3);
  for (int trial = 0; trial < 20; ++trial) {
    const std::vector<float> z = random_logits(gen, 64, 2.0);
    SamplingParams greedy;
    greedy.temperature = 0.0f;
    greedy.top_k = 3;
    greedy.top_p = 0.1f;
    greedy.min_p = 0.9f;
    SamplingParams cold;
    cold.temperature = 1e-4f;
    TokenDistribution a, b;
    ASSERT_TRUE(process_logits(z, greedy, nullptr, &a).is_ok());
    ASSERT_TRUE(process_logits(z, cold, nullptr, &b).is_ok());
    EXPECT_EQ(a.argmax, std::max_element(z.begin(), z.end()) - z.begin());
    EXPECT_EQ(a.kept, std::vector<int32_t>{a.argmax});
    EXPECT_GT(b.probs[a.argmax], 0.999);
  }
}

TEST(Sampler, MatchesNaiveReferenceOnRandomRows) {
  std::mt19937_64 gen(11);
  int cases = 0;
  for (int vocab : {7, 50, 1000}) {
    for (float t : {0.3f, 0.7f, 1.0f, 1.6f}) {
      for (int k : {0, 1, 5, 40}) {
        for (float p : {1.0f, 0.95f, 0.5f, 0.1f}) {
          for (float mp : {0.0f, 0.05f, 0.3f}) {
            SamplingParams sp;
            sp.temperature = t;
            sp.top_k = k;
            sp.top_p = p;
            sp.min_p = mp;
            const std::vector<float> z = random_logits(gen, vocab, vocab == 1000 ? 3.0 : 1.5);
            expect_matches_naive(z, sp, fmt::format("V={} T={} k={} p={} min_p={}", vocab, t, k, p, mp));
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 3 * 4 * 4 * 4 * 3);
}

TEST(Sampler, LargeNucleusGrowsTheSortedHead) {
  // Flat logits make the top-p nucleus span thousands of tokens, past every head size of the partial sort.
  std::mt19937_64 gen(5);
  for (float p : {0.3f, 0.9f, 0.999f}) {
    SamplingParams sp;
    sp.top_p = p;
    expect_matches_naive(random_logits(gen, 20000, 0.3), sp, fmt::format("flat V=20000 p={}", p));
    sp.top_k = 3000;
    expect_matches_naive(random_logits(gen, 20000, 0.3), sp, fmt::format("flat V=20000 p={} k=3000", p));
  }
}

TEST(Sampler, TruncationTiesBreakToLowestId) {
  const std::vector<float> z(10, 0.5f);  // ten equally likely tokens
  SamplingParams sp;
  sp.top_k = 3;
  TokenDistribution d;
  ASSERT_TRUE(process_logits(z, sp, nullptr, &d).is_ok());
  EXPECT_EQ(d.kept, (std::vector<int32_t>{0, 1, 2}));
  // top_p 0.35 over ten tokens of 0.1: masses before the 1st..4th are 0, .1, .2, .3 < .35 -> four kept.
  sp.top_k = 0;
  sp.top_p = 0.35f;
  ASSERT_TRUE(process_logits(z, sp, nullptr, &d).is_ok());
  EXPECT_EQ(d.kept, (std::vector<int32_t>{0, 1, 2, 3}));
  for (int32_t t : d.kept) EXPECT_DOUBLE_EQ(d.probs[t], 0.25);
}

TEST(Sampler, MinPIsRelativeToTheMostLikelyTokenAfterTemperature) {
  // Probability ratios to the top token: 1, 0.3, 0.2, e^-5.
  const std::vector<float> z = {10.0f, 10.0f + std::log(0.3f), 10.0f + std::log(0.2f), 5.0f};
  SamplingParams sp;
  sp.min_p = 0.25f;
  TokenDistribution d;
  ASSERT_TRUE(process_logits(z, sp, nullptr, &d).is_ok());
  EXPECT_EQ(d.kept, (std::vector<int32_t>{0, 1}));
  // At T = 2 the ratios become their square roots (0.55, 0.45, 0.08): min_p applies after temperature.
  sp.temperature = 2.0f;
  ASSERT_TRUE(process_logits(z, sp, nullptr, &d).is_ok());
  EXPECT_EQ(d.kept, (std::vector<int32_t>{0, 1, 2}));
}

TEST(Sampler, PenaltiesAndBiasMatchNaiveReference) {
  std::mt19937_64 gen(17);
  const int vocab = 40;
  for (int trial = 0; trial < 30; ++trial) {
    std::vector<float> z = random_logits(gen, vocab, 2.0);
    z[5] = 0.0f;  // a zero logit, the HF boundary case
    NaiveHistory h;
    std::uniform_int_distribution<int32_t> tok(0, vocab - 1);
    for (int i = 0; i < 8; ++i) h.prompt.push_back(tok(gen));
    for (int i = 0; i < 12; ++i) h.output.push_back(tok(gen));
    h.output.push_back(5);
    SamplingParams sp;
    sp.repetition_penalty = trial % 3 == 0 ? 1.0f : (trial % 3 == 1 ? 1.3f : 0.8f);
    sp.frequency_penalty = 0.4f;
    sp.presence_penalty = trial % 2 == 0 ? 0.7f : -0.3f;
    sp.logit_bias = {{tok(gen), 5.0f}, {tok(gen), -100.0f}, {h.output[0], 1.5f}};
    ASSERT_TRUE(sp.validate(vocab).is_ok());
    TokenHistory history(vocab);
    history.add_prompt(h.prompt);
    for (int32_t t : h.output) history.push(t);
    TokenDistribution d;
    ASSERT_TRUE(process_logits(z, sp, &history, &d).is_ok());
    const std::vector<float> ref = naive_penalised(z, sp, h);
    for (int32_t t = 0; t < vocab; ++t) ASSERT_EQ(d.logits[t], ref[t]) << "trial " << trial << " token " << t;
    const std::vector<double> ref_p = naive_probs(ref, sp);
    for (int32_t t = 0; t < vocab; ++t) ASSERT_NEAR(d.probs[t], ref_p[t], 1e-12);
  }
}

TEST(Sampler, HistoryPopUndoesPushExactly) {
  const int vocab = 30;
  std::mt19937_64 gen(23);
  const std::vector<float> z = random_logits(gen, vocab, 1.0);
  SamplingParams sp;
  sp.repetition_penalty = 1.2f;
  sp.frequency_penalty = 0.3f;
  sp.presence_penalty = 0.5f;
  TokenHistory history(vocab);
  const std::vector<int32_t> prompt = {1, 2, 3};
  history.add_prompt(prompt);
  history.push(4);
  history.push(2);
  TokenDistribution before, after;
  ASSERT_TRUE(process_logits(z, sp, &history, &before).is_ok());
  const std::set<int32_t> seen_before(history.seen_tokens().begin(), history.seen_tokens().end());
  // A speculative cycle: push three drafts (one repeated, one new), then reject them.
  for (int32_t t : {7, 4, 9}) history.push(t);
  for (int32_t t : {9, 4, 7}) history.pop(t);
  ASSERT_TRUE(process_logits(z, sp, &history, &after).is_ok());
  EXPECT_EQ(before.logits, after.logits);
  EXPECT_EQ(before.probs, after.probs);
  const std::set<int32_t> seen_after(history.seen_tokens().begin(), history.seen_tokens().end());
  EXPECT_EQ(seen_before, seen_after);
  EXPECT_EQ(seen_after, (std::set<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(history.output_count(4), 1);
  EXPECT_EQ(history.output_count(9), 0);
}

TEST(Sampler, RejectsNanAndAllMaskedRows) {
  std::vector<float> z = {0.0f, 1.0f, NAN, 2.0f};
  TokenDistribution d;
  const Status s = process_logits(z, SamplingParams{}, nullptr, &d);
  EXPECT_EQ(s.code(), ErrorCode::kInternal);
  EXPECT_NE(s.message().find("at token 2"), std::string::npos) << s.message();
  const std::vector<float> masked(5, -INFINITY);
  EXPECT_FALSE(process_logits(masked, SamplingParams{}, nullptr, &d).is_ok());
  // -inf entries are fine when something else is finite.
  z[2] = -INFINITY;
  ASSERT_TRUE(process_logits(z, SamplingParams{}, nullptr, &d).is_ok());
  EXPECT_EQ(d.kept, (std::vector<int32_t>{0, 1, 3}));
}

TEST(Sampler, LogprobsDescribeTheSamplingDistribution) {
  std::mt19937_64 gen(29);
  const std::vector<float> z = random_logits(gen, 200, 2.0);
  SamplingParams sp;
  sp.temperature = 0.8f;
  sp.top_p = 0.9f;
  sp.logprobs = true;
  sp.top_logprobs = 5;
  TokenDistribution d;
  ASSERT_TRUE(process_logits(z, sp, nullptr, &d).is_ok());
  const std::vector<double> ref = naive_probs(z, sp);
  double mass = 0;
  for (int32_t t = 0; t < 200; ++t) {
    const double lp = token_logprob(d, t);
    if (ref[t] == 0) {
      EXPECT_EQ(lp, -INFINITY);
    } else {
      EXPECT_NEAR(lp, std::log(ref[t]), 1e-9);
    }
    mass += std::exp(lp);
  }
  EXPECT_NEAR(mass, 1.0, 1e-12);
  const std::vector<TokenLogprob> top = top_logprobs(d, 5);
  ASSERT_EQ(top.size(), 5u);
  std::vector<int32_t> order(200);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return ref[a] > ref[b]; });
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(top[i].token, order[i]);
    EXPECT_NEAR(top[i].logprob, std::log(ref[order[i]]), 1e-9);
  }
  // Asking for more than the kept set lists the kept set only.
  EXPECT_EQ(top_logprobs(d, 1000).size(), d.kept.size());
}

TEST(Sampler, GreedyLogprobsUseTheUntruncatedTemperatureOneSoftmax) {
  const std::vector<float> z = {1.0f, 3.0f, -INFINITY, 2.0f};
  SamplingParams sp;
  sp.temperature = 0.0f;
  sp.top_k = 1;
  TokenDistribution d;
  ASSERT_TRUE(process_logits(z, sp, nullptr, &d).is_ok());
  const double lse = std::log(std::exp(1.0) + std::exp(3.0) + std::exp(2.0));
  EXPECT_NEAR(token_logprob(d, 1), 3.0 - lse, 1e-12);
  EXPECT_NEAR(token_logprob(d, 0), 1.0 - lse, 1e-12);
  EXPECT_EQ(token_logprob(d, 2), -INFINITY);
  const std::vector<TokenLogprob> top = top_logprobs(d, 10);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].token, 1);
  EXPECT_EQ(top[1].token, 3);
  EXPECT_EQ(top[2].token, 0);
}

// Cases computed by tools/reference/stats/make_sampler_cases.py with transformers' logits processors
// (repetition penalty, temperature, min-p, top-k, top-p) and OpenAI's presence/frequency formula.
TEST(Sampler, MatchesTransformersLogitsProcessors) {
  const std::string path =
      std::string(PD_SOURCE_DIR) + "/src/puredrive/decode/testdata/hf_sampler_cases.json";
  const Expected<std::string> text = read_text_file(path);
  ASSERT_TRUE(text.has_value()) << text.status().to_string();
  const nlohmann::json doc = nlohmann::json::parse(*text);
  int index = 0;
  for (const auto& c : doc.at("cases")) {
    const std::vector<float> logits = c.at("logits").get<std::vector<float>>();
    const std::vector<double> ref = c.at("probs").get<std::vector<double>>();
    const auto vocab = static_cast<int32_t>(logits.size());
    const auto& p = c.at("params");
    SamplingParams sp;
    sp.temperature = p.at("temperature").get<float>();
    sp.top_k = p.at("top_k").get<int32_t>();
    sp.top_p = p.at("top_p").get<float>();
    sp.min_p = p.at("min_p").get<float>();
    sp.repetition_penalty = p.at("repetition_penalty").get<float>();
    sp.presence_penalty = p.at("presence_penalty").get<float>();
    sp.frequency_penalty = p.at("frequency_penalty").get<float>();
    ASSERT_TRUE(sp.validate(vocab).is_ok());
    TokenHistory history(vocab);
    history.add_prompt(c.at("prompt").get<std::vector<int32_t>>());
    for (int32_t t : c.at("output").get<std::vector<int32_t>>()) history.push(t);
    TokenDistribution d;
    ASSERT_TRUE(process_logits(logits, sp, &history, &d).is_ok());
    for (int32_t t = 0; t < vocab; ++t) {
      ASSERT_EQ(d.probs[t] > 0.0, ref[t] > 0.0) << "case " << index << " token " << t << " kept differs";
      ASSERT_NEAR(d.probs[t], ref[t], 1e-6 * ref[t] + 1e-12) << "case " << index << " token " << t;
    }
    ++index;
  }
  EXPECT_EQ(index, 24);
}

TEST(Sampler, SampleFrequenciesFitTheDistribution) {
  std::mt19937_64 gen(31);
  SamplingParams sp;
  sp.top_k = 20;
  sp.temperature = 0.9f;
  TokenDistribution d;
  ASSERT_TRUE(process_logits(random_logits(gen, 32, 1.5), sp, nullptr, &d).is_ok());
  Rng rng(77);
  std::vector<int64_t> counts(32, 0);
  for (int i = 0; i < 50000; ++i) ++counts[sample(d, rng)];
  const ChiSquareResult r = chi_square_goodness_of_fit(counts, d.probs);
  std::printf("sample(): %s\n", r.summary().c_str());
  EXPECT_EQ(r.impossible, 0);
  EXPECT_GT(r.p_value, 1e-3);
}

TEST(Sampler, DistributionFromWeightsNormalises) {
  const std::vector<double> w = {0.0, 2.0, 1.0, 1.0};
  const TokenDistribution d = distribution_from_weights(w);
  EXPECT_EQ(d.kept, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_DOUBLE_EQ(d.probs[1], 0.5);
  EXPECT_EQ(d.argmax, 1);
  EXPECT_EQ(d.probs[0], 0.0);
}

}  // namespace
}  // namespace pd
