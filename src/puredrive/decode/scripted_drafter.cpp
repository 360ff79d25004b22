#include "puredrive/decode/scripted_drafter.h"

#include <algorithm>

namespace pd {

Status ScriptedDrafter::draft(SequenceState& /*state*/, const DraftContext& ctx, DraftBlock* out) {
  const int k = ctx.num_draft;
  const auto generated = static_cast<int64_t>(ctx.sequence.size()) - ctx.prompt_length;
  int right = k;
  if (mode_ == Mode::kRandomPrefix) {
    right = static_cast<int>(std::min<uint64_t>(rng_.next_u64() % static_cast<uint64_t>(k + 1), k));
  }
  out->tokens.clear();
  out->dists.resize(static_cast<size_t>(k));
  for (int j = 0; j < k; ++j) {
    const int64_t i = generated + j;
    const int32_t want = i < static_cast<int64_t>(future_.size()) ? future_[static_cast<size_t>(i)] : 0;
    int32_t d = want;
    if (j >= right) {
      // Any other token: shift by 1..V-1.
      const auto shift = static_cast<int32_t>(1 + rng_.next_u64() % static_cast<uint64_t>(vocab_ - 1));
      d = (want + shift) % vocab_;
    }
    out->tokens.push_back(d);
    std::vector<double> w(static_cast<size_t>(vocab_), 0.0);
    w[static_cast<size_t>(d)] = 1.0;
    out->dists[static_cast<size_t>(j)] = distribution_from_weights(w);
  }
  return Status::ok();
}

}  // namespace pd
