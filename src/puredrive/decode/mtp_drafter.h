// MtpDrafter: drafts with the model's MTP head (docs/spec/qwen3_5_moe.md §8, docs/spec/speculative.md §1).
//
// The head's row at position i takes (embedding of x_{i+1}, the target's final-norm hidden at i) and predicts
// x_{i+2}; its KV cache must hold such a row for every committed position. observe()d rows are kept pending
// (token + a copy of the hidden) and run in one mtp_forward together with the first draft step: the last
// pending row (x_n, h_{n-1}, n-1) is exactly the row that predicts d_1. d_2..d_k chain on the head's own
// output (token d_{j-1}, the previous post-mtp.norm hidden, position n+j-2). The chained rows write
// speculative KV entries at positions n..n+k-2; the next cycle's observe() overwrites them with the
// committed rows. The drafts are drawn on the device and stay there (DeviceSampler::queue_draft): the chained
// steps and the verify step read them from the sampler's drafts, so drafting never waits for the host. A
// prefix cache copies the head's rows at its snapshot points (commit() runs the pending rows but the last)
// and puts them back on a hit (resume() at the restored position, then the cached hidden state is observed as
// the pending row).
#pragma once

#include <vector>

#include "puredrive/decode/drafter.h"
#include "puredrive/model/model.h"

namespace pd {

class MtpDrafter : public Drafter {
 public:
  // Rows observed one or a few at a time (decode steps) run through the head once this many are pending.
  static constexpr int kPendingRows = 8;

  static Expected<std::unique_ptr<MtpDrafter>> create(Model& model);

  void reset() override;
  Status commit(SequenceState& state) override;
  Status observe(SequenceState& state, int first, std::span<const int32_t> next_tokens,
                 const Tensor& hidden) override;
  bool can_draft(int64_t position) const override;
  Status draft(SequenceState& state, const DraftContext& ctx, DraftBlock* out) override;
  // Continues a sequence whose head cache already holds positions [0, position) (a synthetic fill, `bench`; a
  // prefix-cache hit): the next observe() starts at `position` (>= 1).
  Status resume(int position) override;
  int pending_rows() const { return static_cast<int>(pending_tokens_.size()); }

 private:
  MtpDrafter(Model& model, Buffer pending_hidden)
      : model_(model), pending_hidden_(std::move(pending_hidden)) {}
  // Runs the pending rows through the head, or all but the last (keep_last, at least 2 pending); returns the
  // step output (logits of the last row run when asked).
  // prompt: the rows are the prompt's, run through the prefill kernels (chunk-invariant), so that the head's
  // cache rows do not depend on how the prompt was cut (a prefix-cache hit resumes at another cut).
  Expected<StepOutput> flush(SequenceState& state, LogitRows logits, bool keep_last = false,
                             bool prompt = false);
  // Hidden rows into the pending buffer through copy_many: on the GPU its addresses are data of the step, so
  // the steps that place their rows at different offsets of the buffer share one graph.
  Status place_rows(const Tensor& dst, const Tensor& src);

  Model& model_;
  Buffer pending_hidden_;  // F32 [max_rows, H]: hidden states of the pending rows
  std::vector<int32_t> pending_tokens_;
  int pending_first_ = 0;  // position of the first pending row
  int observed_end_ = 0;   // one past the last observed position
};

}  // namespace pd
