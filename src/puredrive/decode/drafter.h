// Drafter: what the generator asks for draft tokens in an MTP cycle (docs/spec/speculative.md §1). The real
// one is the MTP head (mtp_drafter.h); tests and `puredrive check` plug in scripted drafters
// (scripted_drafter.h) that force full acceptance or a rejection at a chosen offset, so every rollback path
// gets exercised.
//
// Protocol, with x_n the newest committed token (not yet run through the target) at position n:
//   - observe() hands over target rows as soon as the token after them is known: row r is position
//     first + r, its final-norm hidden state hidden[r] and next_tokens[r] = x_{first + r + 1}. The prompt
//     arrives in prefill chunks, then every step's accepted rows; each call continues where the last one
//     ended. The hidden view is valid only during the call.
//   - can_draft(n) says whether drafting after position n is possible (the MTP head needs the hidden state
//     of position n - 1, so not right after a 1-token prompt).
//   - draft() proposes d_1..d_k for positions n+1..n+k, each drawn with the rule's draw_token() from its
//     draft distribution q_j. The MTP head draws on the device (DeviceSampler::queue_draft), which leaves
//     the drafts where the verify step reads them, and only queues work: the host learns the drafts that
//     survived from the cycle's one download. For kTokenwise / kBlock the drafter also leaves the logits
//     rows of q_1..q_k in DeviceSampler::draft_rows(k), processed with the draft params by the verify step.
//   - draft() and observe() run inside the generator's recorded step (Backend::begin_step): they may queue
//     device work and upload, but never download or synchronise.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "puredrive/backend/backend.h"
#include "puredrive/decode/acceptance.h"
#include "puredrive/decode/device_sampler.h"
#include "puredrive/decode/seeded_noise.h"
#include "puredrive/model/sequence_state.h"
#include "puredrive/util/status.h"

namespace pd {

// What a drafter proposes for one cycle.
struct DraftBlock {
  std::vector<int32_t> tokens;  // d_1..d_k when picked on the host (the generator uploads them)
  bool on_device = false;       // drawn into the DeviceSampler's drafts on the device; `tokens` is empty
};

struct DraftContext {
  std::span<const int32_t> sequence;  // prompt + generated tokens; the last one is x_n
  int prompt_length = 0;
  int num_draft = 0;  // k
  AcceptRule rule = AcceptRule::kGreedy;
  DeviceSampler* sampler = nullptr;  // draws with the draft params; holds the q rows
  Rng* rng = nullptr;                // kTokenwise / kBlock draws
  uint64_t seed = 0;                 // kSeeded noise
  bool keep_logits = false;          // leave the q rows in sampler->draft_rows(k) whatever the rule

  int64_t position() const { return static_cast<int64_t>(sequence.size()) - 1; }  // n
  bool needs_rows() const {
    return keep_logits || rule == AcceptRule::kTokenwise || rule == AcceptRule::kBlock;
  }
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  // A new sequence starts (drops whatever was observed).
  virtual void reset() = 0;
  // A new sequence starts whose first `position` rows the drafter has in the state already (a prefix-cache
  // hit restored the MTP head's KV rows): observing continues at `position`.
  virtual Status resume(int position) {
    (void)position;
    reset();
    return Status::ok();
  }
  // Puts every observed row but the last into the state (the MTP head's KV rows), so that a prefix cache can
  // copy them; the last row stays for the next draft.
  virtual Status commit(SequenceState& state) {
    (void)state;
    return Status::ok();
  }
  virtual Status observe(SequenceState& state, int first, std::span<const int32_t> next_tokens,
                         const Tensor& hidden) = 0;
  virtual bool can_draft(int64_t position) const = 0;
  virtual Status draft(SequenceState& state, const DraftContext& ctx, DraftBlock* out) = 0;
};

}  // namespace pd
