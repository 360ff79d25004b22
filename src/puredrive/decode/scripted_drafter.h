// ScriptedDrafter: a drafter that knows the answer, for the exactness tests and `puredrive check`. Given the
// tokens a plain run generated (the "future"), it proposes
//   - kOracle: the next k of them, so a correct generator accepts all k and adds the bonus token;
//   - kRandomPrefix: the next m of them (m uniform in 0..k, fresh each cycle), then tokens that differ from
//     the future, so a greedy / seeded generator accepts exactly m and rolls back at every offset.
// The draft distributions are point masses on the proposals (q(d) = 1), which keeps token-wise and block
// verification exact too; the drafter uploads them as logits rows that are -inf but at the proposal.
#pragma once

#include <cstdint>
#include <vector>

#include "puredrive/decode/drafter.h"

namespace pd {

class ScriptedDrafter : public Drafter {
 public:
  enum class Mode { kOracle, kRandomPrefix };

  ScriptedDrafter(std::vector<int32_t> future, Mode mode, int32_t vocab_size, uint64_t seed)
      : future_(std::move(future)), mode_(mode), vocab_(vocab_size), rng_(seed) {}

  void reset() override {}
  Status observe(SequenceState&, int, std::span<const int32_t>, const Tensor&) override {
    return Status::ok();
  }
  bool can_draft(int64_t) const override { return true; }
  Status draft(SequenceState& state, const DraftContext& ctx, DraftBlock* out) override;

 private:
  std::vector<int32_t> future_;
  Mode mode_;
  int32_t vocab_;
  Rng rng_;
};

}  // namespace pd
