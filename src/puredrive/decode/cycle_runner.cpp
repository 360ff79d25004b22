#include "puredrive/decode/cycle_runner.h"

#include <chrono>
#include <numeric>

#include "puredrive/util/clock.h"

namespace pd {
namespace {

using Clock = std::chrono::steady_clock;

bool uses_uniforms(AcceptRule rule) {
  return rule == AcceptRule::kTokenwise || rule == AcceptRule::kBlock;
}

}  // namespace

CycleRunner::CycleRunner(Model& model, SequenceState& state, DeviceSampler& sampler, Drafter* drafter,
                         Rng& draft_rng, Rng& accept_rng, const CycleSettings& settings)
    : model_(model),
      state_(state),
      sampler_(sampler),
      drafter_(drafter),
      draft_rng_(draft_rng),
      accept_rng_(accept_rng),
      settings_(settings) {}

CycleRunner::~CycleRunner() {
  if (open_) (void)model_.backend().end_step();
}

Status CycleRunner::open() {
  if (open_) return Status::ok();
  PD_TRY(model_.backend().begin_step());
  open_ = true;
  return Status::ok();
}

Status CycleRunner::close() {
  if (!open_) return Status::ok();
  open_ = false;
  return model_.backend().end_step();
}

Status CycleRunner::settle() {
  if (!settings_.timing) return Status::ok();
  PD_TRY(close());
  PD_TRY(model_.backend().synchronize());
  return open();
}

// The sample op's control for a step of k + 1 rows whose first drawn token is at `position`: the uniforms
// come from the acceptance stream in Verifier::accept's order.
Status CycleRunner::stage(int k, int64_t position) {
  uniforms_.clear();
  if (uses_uniforms(settings_.verifier.rule())) {
    for (int j = 0; j <= k; ++j) uniforms_.push_back(accept_rng_.uniform());
  }
  return sampler_.stage(uniforms_, settings_.seed, position);
}

Expected<const Verdict*> CycleRunner::sample(const Tensor& draft_rows) {
  const auto t0 = Clock::now();
  PD_TRY(sampler_.queue_verify(logits_, draft_rows, settings_.verifier, settings_.top_logprobs));
  PD_TRY(close());
  PD_ASSIGN_OR_RETURN(verdict_, sampler_.collect());
  times_.sample_seconds += seconds_since(t0);
  return verdict_;
}

Expected<const Verdict*> CycleRunner::plain_step(std::span<const int32_t> sequence) {
  PD_TRY(open());
  const int32_t token = sequence.back();
  n_ = static_cast<int32_t>(sequence.size() - 1);
  rows_ = 1;
  PD_TRY(stage(0, n_ + 1));
  const auto t0 = Clock::now();
  PD_ASSIGN_OR_RETURN(StepOutput out, model_.forward(state_, std::span(&token, 1), std::span(&n_, 1),
                                                     {.logits = LogitRows::kLast, .tap = {}}));
  PD_TRY(settle());
  times_.target_seconds += seconds_since(t0);
  ++times_.steps;
  ++times_.plain_steps;
  logits_ = out.logits;
  hidden_ = out.hidden;
  return sample(Tensor{});
}

Expected<const Verdict*> CycleRunner::cycle(std::span<const int32_t> sequence, int prompt_length, int k) {
  if (drafter_ == nullptr) return make_error(ErrorCode::kInternal, "MTP cycle without a drafter");
  PD_TRY(open());
  n_ = static_cast<int32_t>(sequence.size() - 1);
  rows_ = k + 1;
  const AcceptRule rule = settings_.verifier.rule();
  // Draft: d_1..d_k end up in the sampler's drafts on the device.
  auto t0 = Clock::now();
  const DraftContext ctx{.sequence = sequence,
                         .prompt_length = prompt_length,
                         .num_draft = k,
                         .rule = rule,
                         .sampler = &sampler_,
                         .rng = &draft_rng_,
                         .seed = settings_.seed};
  PD_TRY(drafter_->draft(state_, ctx, &block_));
  if (!block_.on_device) {
    if (static_cast<int>(block_.tokens.size()) != k) {
      return make_error(ErrorCode::kInternal, "drafter proposed {} tokens, {} asked", block_.tokens.size(),
                        k);
    }
    const int32_t vocab = sampler_.vocab_size();
    for (int32_t d : block_.tokens) {
      if (d < 0 || d >= vocab) return make_error(ErrorCode::kInternal, "drafter proposed token {}", d);
    }
    PD_TRY(sampler_.upload_drafts(block_.tokens));
  }
  PD_TRY(settle());
  times_.draft_seconds += seconds_since(t0);

  // Verify: one target step over [x_n, d_1..d_k]; rows 1..k read the drafts on the device.
  PD_TRY(stage(k, n_ + 1));
  t0 = Clock::now();
  tokens_.assign(static_cast<size_t>(k + 1), 0);
  tokens_[0] = sequence.back();
  positions_.resize(tokens_.size());
  std::iota(positions_.begin(), positions_.end(), n_);
  PD_ASSIGN_OR_RETURN(StepOutput out, model_.forward(state_, tokens_, positions_,
                                                     {.logits = LogitRows::kAll,
                                                      .tap = {},
                                                      .prefill = false,
                                                      .device_tokens = sampler_.drafts(),
                                                      .device_tokens_from = 1}));
  PD_TRY(settle());
  const double verify = seconds_since(t0);
  times_.verify_seconds += verify;
  times_.target_seconds += verify;
  ++times_.steps;
  logits_ = out.logits;
  hidden_ = out.hidden;
  Tensor draft_rows;
  if (uses_uniforms(rule)) {
    PD_ASSIGN_OR_RETURN(draft_rows, sampler_.draft_rows(k));
  }
  return sample(draft_rows);
}

Status CycleRunner::commit(int kept, bool observe) {
  if (verdict_ == nullptr || kept < 1 || kept > static_cast<int>(verdict_->tokens.size())) {
    return make_error(ErrorCode::kInternal, "commit of {} tokens after a verdict of {}", kept,
                      verdict_ == nullptr ? 0 : verdict_->tokens.size());
  }
  PD_TRY(open());
  // The rows that stay are x_n and the drafts before the last kept token.
  if (kept < rows_) PD_TRY(state_.rewind(n_ + kept));
  if (observe && drafter_ != nullptr) {
    PD_TRY(drafter_->observe(state_, n_, std::span(verdict_->tokens).first(static_cast<size_t>(kept)),
                             hidden_.row_slice(0, kept)));
  }
  verdict_ = nullptr;
  return Status::ok();
}

Status CycleRunner::finish() {
  return close();
}

}  // namespace pd
