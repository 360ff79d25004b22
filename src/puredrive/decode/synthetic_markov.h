// Test support: a synthetic "language model" over a small vocabulary, a first-order Markov chain with
// fixed random logits per previous token, processed by the real sampler (with penalties computed from the
// context). The acceptance tests use one as the target and a different one as the draft; its
// distribution() plugs into speculative_harness.h like the real engine does.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "puredrive/decode/sampler.h"
#include "puredrive/decode/speculative_harness.h"
#include "puredrive/decode/token_history.h"

namespace pd {

class SyntheticMarkov {
 public:
  // logits[prev][next] ~ scale * N(0, 1).
  SyntheticMarkov(int vocab, uint64_t seed, double scale, SamplingParams params)
      : vocab_(vocab), params_(std::move(params)), logits_(vocab, std::vector<float>(vocab)) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<double> normal(0.0, scale);
    for (auto& row : logits_) {
      for (float& z : row) z = static_cast<float>(normal(gen));
    }
  }

  // A model whose logits are mix * this + (1 - mix) * fresh noise of the same scale: a draft that
  // resembles the target more as mix -> 1.
  SyntheticMarkov perturbed(double mix, uint64_t seed, double scale, SamplingParams params) const {
    SyntheticMarkov other(vocab_, seed, scale, std::move(params));
    for (int a = 0; a < vocab_; ++a) {
      for (int b = 0; b < vocab_; ++b) {
        other.logits_[a][b] = static_cast<float>(mix * logits_[a][b] + (1.0 - mix) * other.logits_[a][b]);
      }
    }
    return other;
  }

  int vocab() const { return vocab_; }
  const SamplingParams& params() const { return params_; }

  // The first prompt_len tokens of a context are the prompt (for the repetition penalty); the rest are
  // output tokens (for presence / frequency penalties). Without penalties a row depends only on the
  // previous token and is processed once.
  DistributionFn distribution(size_t prompt_len) const {
    if (!params_.has_penalties()) {
      auto rows = std::make_shared<std::vector<TokenDistribution>>(vocab_);
      for (int prev = 0; prev < vocab_; ++prev) {
        const Status s = process_logits(logits_[prev], params_, nullptr, &(*rows)[prev]);
        PD_ASSERT(s.is_ok(), "{}", s.message());
      }
      return [rows](std::span<const int32_t> context, TokenDistribution* out) -> Status {
        *out = (*rows)[context.back()];
        return Status::ok();
      };
    }
    return [this, prompt_len](std::span<const int32_t> context, TokenDistribution* out) -> Status {
      TokenHistory history(vocab_);
      history.add_prompt(context.first(std::min(prompt_len, context.size())));
      for (size_t i = prompt_len; i < context.size(); ++i) history.push(context[i]);
      return process_logits(logits_[context.back()], params_, &history, out);
    };
  }

 private:
  int vocab_;
  SamplingParams params_;
  std::vector<std::vector<float>> logits_;  // [prev][next]
};

}  // namespace pd
