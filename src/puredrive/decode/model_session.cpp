#include "puredrive/decode/model_session.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>

#include "puredrive/util/clock.h"
#include "puredrive/util/log.h"
#include "puredrive/util/progress.h"

namespace pd {

Expected<std::unique_ptr<ModelSession>> ModelSession::open(const SessionOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  auto s = std::make_unique<ModelSession>();
  PD_ASSIGN_OR_RETURN(s->backend, create_backend({.name = o.backend, .threads = o.threads}));
  PD_LOG_INFO("backend: {}{}", s->backend->name(), o.backend == "auto" ? " (--backend auto)" : "");
  if (o.prefill_chunk < 0 || o.prefill_chunk > kMaxPrefillChunk) {
    return make_error(ErrorCode::kInvalidArgument, "prefill chunk must be 1..{} rows (0: chosen), got {}",
                      kMaxPrefillChunk, o.prefill_chunk);
  }
  if (o.mtp_window > 0 && s->backend->device() != Device::kCpu) {
    return make_error(ErrorCode::kUnsupported,
                      "--mtp-window: the MTP attention window runs on the CPU backend only; {} attends every "
                      "cached position",
                      s->backend->name());
  }
  PD_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(o.model_dir));
  // A device holds the draft vocabulary's rows of lm_head once more (at most 2 bytes per weight).
  const bool gpu = s->backend->device() != Device::kCpu;
  const int64_t draft_vocab_bytes = gpu ? int64_t{o.mtp_draft_vocab} * config.hidden_size * 2 : 0;
  // All logits only for verify steps and the row-exactness gate (steps of up to 8 rows).
  const int verify_logit_rows = std::max(8, o.max_draft + 1);
  // Measured before anything is loaded, as the plan counts the weights itself; the step workspaces come off
  // the top.
  const int64_t device_memory = s->backend->available_memory();
  const int chunk = o.prefill_chunk > 0 ? o.prefill_chunk
                                        : choose_prefill_chunk(config, gpu, o.ctx_size, device_memory,
                                                               draft_vocab_bytes, verify_logit_rows);
  const int max_rows = std::max(chunk, o.max_draft + 1);
  const int logit_rows = std::min(max_rows, verify_logit_rows);
  const int64_t workspace = step_workspace_bytes(config, max_rows, logit_rows) + draft_vocab_bytes;
  const int64_t available = device_memory - workspace;
  if (auto estimate = plan_context(config, nullptr, o.ctx_size, available, o.model_dir); !estimate) {
    return estimate.status();
  }
  const auto t_map = std::chrono::steady_clock::now();
  PD_ASSIGN_OR_RETURN(s->checkpoint, load_checkpoint(o.model_dir));
  s->load.map_seconds = seconds_since(t_map);
  PD_ASSIGN_OR_RETURN(s->plan, plan_context(s->checkpoint.config, &s->checkpoint.weights, o.ctx_size,
                                            available, o.model_dir));
  PD_LOG_INFO(
      "memory plan: {} of {} available on {} (after {} of step workspace for {}-row prefill chunks{})",
      describe_plan(s->plan), format_bytes(static_cast<double>(available)), s->backend->name(),
      format_bytes(static_cast<double>(workspace)), max_rows, o.prefill_chunk > 0 ? "" : ", chosen");
  const auto t_up = std::chrono::steady_clock::now();
  {
    // The CPU backend uses the mapped weights in place: nothing to report there.
    const bool copies = s->backend->device() != Device::kCpu;
    Progress progress(fmt::format("loading weights to {}", s->backend->name()),
                      static_cast<uint64_t>(s->plan.weight_bytes),
                      copies ? Progress::Mode::kAuto : Progress::Mode::kOff);
    const int64_t bound_before = s->backend->bound_bytes();
    std::optional<ProgressPoller> poll;
    if (copies) {
      poll.emplace(progress, [&] { return static_cast<uint64_t>(s->backend->bound_bytes() - bound_before); });
    }
    auto model = create_model(s->checkpoint.config, s->checkpoint.weights, *s->backend,
                              {.max_rows = max_rows,
                               .max_logit_rows = logit_rows,
                               .mtp_draft_vocab = o.mtp_draft_vocab,
                               .mtp_window = o.mtp_window});
    poll.reset();
    progress.finish();
    if (!model) return model.status();
    s->model = std::move(model).value();
  }
  s->load.upload_seconds = seconds_since(t_up);
  std::error_code ec;
  if (std::filesystem::exists(o.model_dir + "/tokenizer.json", ec)) {
    PD_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(o.model_dir));
    s->tokenizer = std::move(tok);
  }
  PD_ASSIGN_OR_RETURN(s->defaults,
                      load_generation_defaults(o.model_dir, s->tokenizer ? &*s->tokenizer : nullptr));
  PD_ASSIGN_OR_RETURN(s->generator,
                      Generator::create(*s->model, {.ctx_size = static_cast<int>(s->plan.ctx_size),
                                                    .kv_dtype = o.kv_dtype,
                                                    .max_draft = o.max_draft,
                                                    .mtp = o.mtp}));
  s->load.total_seconds = seconds_since(t0);
  PD_LOG_INFO("model ready in {:.1f} s (checkpoint mapped in {:.1f} s, weights bound in {:.1f} s)",
              s->load.total_seconds, s->load.map_seconds, s->load.upload_seconds);
  return s;
}

}  // namespace pd
