#include "puredrive/decode/model_session.h"

#include <algorithm>
#include <filesystem>

#include "puredrive/util/log.h"

namespace pd {

Expected<std::unique_ptr<ModelSession>> ModelSession::open(const SessionOptions& o) {
  auto s = std::make_unique<ModelSession>();
  PD_ASSIGN_OR_RETURN(s->backend, create_backend({.name = o.backend, .threads = o.threads}));
  PD_LOG_INFO("backend: {}{}", s->backend->name(), o.backend == "auto" ? " (--backend auto)" : "");
  // Measured before anything is loaded, as the plan counts the weights itself.
  const int64_t available = s->backend->available_memory();
  PD_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(o.model_dir));
  if (auto estimate = plan_context(config, nullptr, o.ctx_size, available, o.model_dir); !estimate) {
    return estimate.status();
  }
  PD_ASSIGN_OR_RETURN(s->checkpoint, load_checkpoint(o.model_dir));
  PD_ASSIGN_OR_RETURN(s->plan, plan_context(s->checkpoint.config, &s->checkpoint.weights, o.ctx_size,
                                            available, o.model_dir));
  PD_LOG_INFO("memory plan: {} of {} available on {}", describe_plan(s->plan),
              format_bytes(static_cast<double>(available)), s->backend->name());
  const int max_rows = std::max(o.prefill_chunk, o.max_draft + 1);
  PD_ASSIGN_OR_RETURN(s->model, create_model(s->checkpoint.config, s->checkpoint.weights, *s->backend,
                                             {.max_rows = max_rows}));
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
  return s;
}

}  // namespace pd
