// CycleRunner: the steps of one sequence's decode loop after its prefill, plain one-row steps and MTP cycles
// (docs/spec/speculative.md §1), each with one host synchronisation. The generator runs every request through
// it, and `bench --synth --mtp-draft` times the same cycles.
//
// What a step or cycle queues on the device is one recorded backend step (Backend::begin_step; the CUDA
// backend replays it as one graph per distinct shape): the rollback and observation that the previous
// verdict asked for, then for a cycle the k draft steps of the drafter (their tokens drawn into the
// sampler's drafts on the device, never downloaded), the target step over [x_n, d_1..d_k] that reads the
// drafts where they are, and the sample op. Only its words come back (DeviceSampler::collect: the accepted
// count and tokens, the logprobs a request asks for). The host then knows how many rows stay, so the
// rollback (a GDN snapshot copy, docs/DESIGN.md §4.2) is queued at the head of the next step, as is the
// drafter's observation of the kept rows.
//
// With CycleSettings::timing the runner closes the recorded step after the draft and the target step and
// waits for the device, so that draft, verify and sample times come apart (three graphs per cycle).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "puredrive/decode/acceptance.h"
#include "puredrive/decode/device_sampler.h"
#include "puredrive/decode/drafter.h"
#include "puredrive/model/model.h"

namespace pd {

struct CycleSettings {
  Verifier verifier{AcceptRule::kGreedy};
  uint64_t seed = 0;      // the kSeeded noise
  int top_logprobs = -1;  // -1, or the alternatives each emitted token lists
  bool timing = false;    // wait for the device between phases
};

// Where a request's decode time goes, filled in by the runner (DecodeResult keeps the same fields).
struct CycleTimes {
  int64_t steps = 0;  // target steps: plain steps + verify steps
  int64_t plain_steps = 0;
  double draft_seconds = 0;
  double verify_seconds = 0;
  double target_seconds = 0;  // plain and verify steps
  double sample_seconds = 0;  // the sample op, its download, and (without timing) the wait for the step
};

class CycleRunner {
 public:
  // draft_rng / accept_rng: the kTokenwise / kBlock uniforms of the draft draws and of the acceptance.
  // drafter may be null (plain steps only).
  CycleRunner(Model& model, SequenceState& state, DeviceSampler& sampler, Drafter* drafter, Rng& draft_rng,
              Rng& accept_rng, const CycleSettings& settings);
  // Runs what is still queued, discarding its errors (finish() reports them).
  ~CycleRunner();
  CycleRunner(const CycleRunner&) = delete;
  CycleRunner& operator=(const CycleRunner&) = delete;

  // A plain step: x_n = sequence.back() at position n = sequence.size() - 1 (the state holds [0, n)).
  Expected<const Verdict*> plain_step(std::span<const int32_t> sequence);
  // A cycle of k >= 1 drafts after x_n; the drafter must be able to draft after n.
  Expected<const Verdict*> cycle(std::span<const int32_t> sequence, int prompt_length, int k);
  // The raw logits rows of the last step: row i is what token i of its verdict came from. Valid until the
  // next step.
  const Tensor& logits() const { return logits_; }

  // After the first `kept` (>= 1) tokens of the last verdict were emitted (a stop may cut a cycle short):
  // the state keeps the step's rows up to them, and when `observe` the drafter sees those rows. Queued at
  // the head of the next step.
  Status commit(int kept, bool observe);
  // Runs what commit() queued; the state is then final.
  Status finish();

  const CycleTimes& times() const { return times_; }

 private:
  Status open();
  Status close();
  // With timing: closes the step, waits for the device, opens the next.
  Status settle();
  Status stage(int k, int64_t position);
  // Queues the sample op over the step's rows, runs the step and collects the verdict.
  Expected<const Verdict*> sample(const Tensor& draft_rows);

  Model& model_;
  SequenceState& state_;
  DeviceSampler& sampler_;
  Drafter* drafter_;
  Rng& draft_rng_;
  Rng& accept_rng_;
  CycleSettings settings_;
  CycleTimes times_;
  bool open_ = false;

  // The last step: its first position, its rows, its outputs, its verdict.
  int32_t n_ = 0;
  int rows_ = 0;
  Tensor logits_, hidden_;
  const Verdict* verdict_ = nullptr;

  std::vector<double> uniforms_;
  std::vector<int32_t> tokens_, positions_;
  DraftBlock block_;
};

}  // namespace pd
