#include "puredrive/decode/scripted_drafter.h"

#include <algorithm>
#include <limits>

namespace pd {

Status ScriptedDrafter::draft(SequenceState& /*state*/, const DraftContext& ctx, DraftBlock* out) {
  const int k = ctx.num_draft;
  const auto generated = static_cast<int64_t>(ctx.sequence.size()) - ctx.prompt_length;
  int right = k;
  if (mode_ == Mode::kRandomPrefix) {
    right = static_cast<int>(std::min<uint64_t>(rng_.next_u64() % static_cast<uint64_t>(k + 1), k));
  }
  out->tokens.clear();
  out->on_device = false;
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
  }
  if (!ctx.needs_rows()) return Status::ok();
  // Point masses: a logits row that is -inf but at the draft stays a point mass through any processing.
  PD_ASSIGN_OR_RETURN(Tensor rows, ctx.sampler->draft_rows(k));
  std::vector<float> host(static_cast<size_t>(k) * static_cast<size_t>(vocab_),
                          -std::numeric_limits<float>::infinity());
  for (int j = 0; j < k; ++j)
    host[static_cast<size_t>(j) * vocab_ + static_cast<size_t>(out->tokens[j])] = 0.0f;
  return ctx.sampler->backend().upload(rows, host.data());
}

}  // namespace pd
