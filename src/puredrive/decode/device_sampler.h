// DeviceSampler: how the decode loop and the drafter reach the backend's sample op (backend.h SampleArgs),
// so that logits rows stay on the device and only the accepted count and tokens come back (plus the
// logprobs a request asks for). It owns the op's buffers on the model's backend, one request at a time: the
// control block (seed, position, uniforms), the cycle's drafts, the draft rows q_1..q_k, the output, and when
// the request needs them the logit bias row and the penalties' token history (prompt marks and output counts;
// the verify call adds the emitted tokens on the device).
//
// The op computes exactly what process_logits() + draw_token() / Verifier::accept() compute on the host
// (backend/cpu/sampling.h is the reference of both), so plain and speculative decoding, the CPU and the
// CUDA backend all emit the same tokens for the same inputs.
//
// One host synchronisation per step or cycle: queue_draft() and queue_verify() only queue the op (each call
// writes its own output words), and collect() reads them all back with one download. Between them nothing
// waits for the device, so a whole MTP cycle can be recorded as one backend step (a CUDA graph).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "puredrive/backend/backend.h"
#include "puredrive/decode/acceptance.h"
#include "puredrive/decode/sampling_params.h"
#include "puredrive/util/status.h"

namespace pd {

// The log-probability of an emitted token under log_softmax of its raw logits row, and the most likely
// alternatives (the server's convention, engine_port.h).
struct TokenLogprobs {
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // most likely first
};

struct Verdict {
  int accepted = 0;                     // a
  std::vector<int32_t> tokens;          // d_1..d_a, y
  std::vector<TokenLogprobs> logprobs;  // one per token when asked
};

class DeviceSampler {
 public:
  static Expected<std::unique_ptr<DeviceSampler>> create(Backend& backend, int32_t vocab);

  Backend& backend() const { return backend_; }
  int32_t vocab_size() const { return vocab_; }

  // A request starts: `target` processes the target's rows, `draft` the drafter's (the same penalties, maybe
  // another temperature; target's logit bias applies to both). Uploads the logit bias and, with penalties,
  // the prompt's history.
  Status begin(const SamplingParams& target, const SamplingParams& draft, std::span<const int32_t> prompt);

  // The drafts d_1..d_k the next verify checks: queue_draft() leaves them here on the device; drafters that
  // pick tokens on the host upload them.
  Status upload_drafts(std::span<const int32_t> tokens);
  // Where they live: I32 [1, kSampleMaxRows], d_j at column j - 1. The verify step and the MTP head's chained
  // draft steps read their token ids from here (ForwardOptions::device_tokens).
  const Tensor& drafts() const { return drafts_.tensor(); }
  // d_1..d_k downloaded (tests and reports; waits for the device).
  Expected<std::vector<int32_t>> download_drafts(int k);

  // Rows [0, k) for the draft distributions q_1..q_k (F32 [k, V]), allocated on first use.
  Expected<Tensor> draft_rows(int k);

  // The control values of the next draw_draft() or verify(): the seed of the seeded noise, the absolute
  // position of the first token the call draws, and the uniforms of kTokenwise / kBlock (Verifier::accept's
  // order: k + 1 for a verify, 1 for a draw; empty for the other rules). Staged before the step that produces
  // the call's rows is queued, the upload does not wait for that step.
  Status stage(std::span<const double> uniforms, uint64_t seed, int64_t position);

  // The drafter's draw from one logits row (F32 [1, V]) with the draft params, after `prior` drafts of this
  // cycle (they count in the penalties): `rule`'s draw_token() with the staged uniform or the seeded noise at
  // the staged position. Queues the op, which stores the token as draft prior + 1 on the device; the next
  // collect() reports its errors.
  Status queue_draft(const Tensor& row, AcceptRule rule, int prior);
  // queue_draft(), then the drawn token downloaded (tests).
  Expected<int32_t> draw_draft(const Tensor& row, AcceptRule rule, int prior);

  // Queues the verification of drafts d_1..d_k (k = logits.rows - 1; k = 0 is a plain step) against the
  // target rows p_0..p_k with `verifier` and the staged control (position: that of d_1); draft_rows holds
  // q_1..q_k for kTokenwise / kBlock. The emitted tokens join the history. top_logprobs: -1 or how many
  // alternatives each emitted token lists.
  Status queue_verify(const Tensor& logits, const Tensor& draft_rows, const Verifier& verifier,
                      int top_logprobs);
  // Waits for the queued ops and reads their words in one download: the errors of the draft draws (in
  // order), then the verdict of the queued verification.
  Expected<const Verdict*> collect();
  // queue_verify(), then collect().
  Expected<const Verdict*> verify(const Tensor& logits, const Tensor& draft_rows, const Verifier& verifier,
                                  int top_logprobs);

 private:
  DeviceSampler(Backend& backend, int32_t vocab) : backend_(backend), vocab_(vocab) {}
  // Queues the op with its output at word `offset` of out_.
  Status launch(SampleArgs& args, int rows, int64_t offset);
  // The error a call's output words report, if any.
  Status check(const int32_t* words) const;

  Backend& backend_;
  int32_t vocab_;
  SampleParams target_, draft_;
  bool penalised_ = false;
  Buffer control_, drafts_, out_, bias_, history_, draft_rows_;
  bool has_bias_ = false;
  std::vector<int64_t> control_host_;
  std::vector<int32_t> out_host_;
  std::vector<int> queued_draws_;  // priors of the draws since the last collect(), in order
  int queued_rows_ = 0;            // rows of the queued verification (0: none)
  int queued_logprobs_ = -1;
  Verdict verdict_;
};

}  // namespace pd
