#include "puredrive/decode/mtp_drafter.h"

#include <algorithm>
#include <numeric>

namespace pd {

Expected<std::unique_ptr<MtpDrafter>> MtpDrafter::create(Model& model) {
  if (!model.has_mtp()) {
    return make_error(ErrorCode::kUnsupported,
                      "the checkpoint has no MTP head (mtp.* tensors): speculative decoding needs one; use "
                      "plain decoding (--no-mtp)");
  }
  PD_ASSIGN_OR_RETURN(Buffer pending,
                      model.backend().alloc(DType::kF32, model.max_rows(), model.config().hidden_size));
  return std::unique_ptr<MtpDrafter>(new MtpDrafter(model, std::move(pending)));
}

void MtpDrafter::reset() {
  pending_tokens_.clear();
  pending_first_ = 0;
  observed_end_ = 0;
}

Status MtpDrafter::commit(SequenceState& state) {
  const auto n = static_cast<int>(pending_tokens_.size());
  if (n <= 1) return Status::ok();
  PD_ASSIGN_OR_RETURN(StepOutput out, flush(state, LogitRows::kNone, /*keep_last=*/true, /*prompt=*/true));
  (void)out;
  return Status::ok();
}

Status MtpDrafter::observe(SequenceState& state, int first, std::span<const int32_t> next_tokens,
                           const Tensor& hidden) {
  const auto rows = static_cast<int>(next_tokens.size());
  if (rows == 0) return Status::ok();
  if (first != observed_end_ || hidden.rows != rows) {
    return make_error(ErrorCode::kInternal,
                      "MTP drafter: observed {} rows ({} hidden rows) at position {}, expected {}", rows,
                      hidden.rows, first, observed_end_);
  }
  const int cap = static_cast<int>(pending_hidden_.tensor().rows);
  if (rows > cap) return make_error(ErrorCode::kInternal, "MTP drafter: {} rows exceed {}", rows, cap);
  // Decode steps add a few rows each (a plain step one). Kept until the buffer is full, each such row would
  // be copied to a new place, and the CUDA backend would record a new graph for every plain step; run through
  // the head every kPendingRows rows, they take a few shapes that replay. A prompt's chunk left pending runs
  // on the prefill kernels, as it would have at the next chunk.
  const int pending = static_cast<int>(pending_tokens_.size());
  const int limit = rows <= kPendingRows ? std::min(cap, kPendingRows) : cap;
  if (pending > 0 && pending + rows > limit) {
    PD_ASSIGN_OR_RETURN(StepOutput flushed, flush(state, LogitRows::kNone, /*keep_last=*/false,
                                                  /*prompt=*/pending > kPendingRows || rows > kPendingRows));
    (void)flushed;
  }
  if (pending_tokens_.empty()) pending_first_ = first;
  const auto at = static_cast<int64_t>(pending_tokens_.size());
  PD_TRY(place_rows(pending_hidden_.row_slice(at, rows), hidden));
  pending_tokens_.insert(pending_tokens_.end(), next_tokens.begin(), next_tokens.end());
  observed_end_ = first + rows;
  return Status::ok();
}

Status MtpDrafter::place_rows(const Tensor& dst, const Tensor& src) {
  if (!dst.contiguous() || !src.contiguous() || dst.dtype != src.dtype || dst.rows != src.rows ||
      dst.cols != src.cols) {
    return model_.backend().copy(dst, src);  // copy() checks the shapes and takes any strides
  }
  const CopyRegion region{.dst = dst, .dst_offset = 0, .src = src, .src_offset = 0, .bytes = src.nbytes()};
  return model_.backend().copy_many(std::span(&region, 1));
}

bool MtpDrafter::can_draft(int64_t position) const {
  return !pending_tokens_.empty() && observed_end_ == position;
}

Expected<StepOutput> MtpDrafter::flush(SequenceState& state, LogitRows logits, bool keep_last, bool prompt) {
  const auto pending = static_cast<int>(pending_tokens_.size());
  const int n = keep_last ? pending - 1 : pending;
  std::vector<int32_t> positions(static_cast<size_t>(n));
  std::iota(positions.begin(), positions.end(), pending_first_);
  // Entries after the first pending row are stale drafts of an earlier cycle (or another sequence).
  state.truncate_mtp(pending_first_);
  PD_ASSIGN_OR_RETURN(StepOutput out, model_.mtp_forward(state, std::span(pending_tokens_).first(n),
                                                         positions, pending_hidden_.row_slice(0, n),
                                                         {.logits = logits, .tap = {}, .prefill = prompt}));
  // The row kept moves to the front (a row does not depend on the step it runs in: row-exact).
  if (keep_last) PD_TRY(place_rows(pending_hidden_.row_slice(0, 1), pending_hidden_.row_slice(n, 1)));
  pending_tokens_.erase(pending_tokens_.begin(), pending_tokens_.begin() + n);
  pending_first_ += n;
  return out;
}

Status MtpDrafter::draft(SequenceState& state, const DraftContext& ctx, DraftBlock* out) {
  const int64_t n = ctx.position();
  if (!can_draft(n) || pending_tokens_.back() != ctx.sequence.back()) {
    return make_error(ErrorCode::kInternal,
                      "MTP drafter: asked to draft after position {} but observed up to {}", n,
                      observed_end_);
  }
  if (ctx.sampler == nullptr) return make_error(ErrorCode::kInternal, "MTP drafter: no sampler");
  out->tokens.clear();
  out->on_device = true;
  Tensor rows;
  if (ctx.needs_rows()) {
    PD_ASSIGN_OR_RETURN(rows, ctx.sampler->draft_rows(ctx.num_draft));
  }
  const bool uses_u = ctx.rule == AcceptRule::kTokenwise || ctx.rule == AcceptRule::kBlock;
  // The draw's control goes up before the head's step is queued (the upload then waits for nothing).
  auto stage = [&](int j) {
    const double u = uses_u ? ctx.rng->uniform() : 0.0;
    return ctx.sampler->stage(uses_u ? std::span<const double>(&u, 1) : std::span<const double>(), ctx.seed,
                              n + j + 1);
  };
  PD_TRY(stage(0));
  PD_ASSIGN_OR_RETURN(StepOutput step, flush(state, LogitRows::kLast));
  for (int j = 0; j < ctx.num_draft; ++j) {
    if (j > 0) {
      PD_TRY(stage(j));
      // Chain: (d_j, the previous post-norm hidden) at position n + j - 1 predicts d_{j+1}. d_j never leaves
      // the device: the head reads it where the draw left it.
      const int32_t placeholder = 0;
      const auto position = static_cast<int32_t>(n + j - 1);
      PD_ASSIGN_OR_RETURN(step,
                          model_.mtp_forward(state, std::span(&placeholder, 1), std::span(&position, 1),
                                             step.hidden.row_slice(step.hidden.rows - 1, 1),
                                             {.logits = LogitRows::kLast,
                                              .tap = {},
                                              .prefill = false,
                                              .device_tokens = ctx.sampler->drafts().col_slice(j - 1, 1),
                                              .device_tokens_from = 0}));
    }
    if (!rows.empty()) PD_TRY(model_.backend().copy(rows.row_slice(j, 1), step.logits));
    PD_TRY(ctx.sampler->queue_draft(step.logits, ctx.rule, j));
  }
  return Status::ok();
}

Status MtpDrafter::resume(int position) {
  if (position < 1) {
    return make_error(ErrorCode::kInvalidArgument, "MTP drafter: resume at position {} (needs >= 1)",
                      position);
  }
  reset();
  pending_first_ = position;
  observed_end_ = position;
  return Status::ok();
}

}  // namespace pd
