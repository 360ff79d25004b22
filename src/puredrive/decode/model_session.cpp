#include "puredrive/decode/model_session.h"

#include <algorithm>
#include <filesystem>

#include "puredrive/model/memory_plan.h"

namespace pd {

Expected<std::unique_ptr<ModelSession>> ModelSession::open(const SessionOptions& o) {
  auto s = std::make_unique<ModelSession>();
  PD_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(o.model_dir));
  PD_ASSIGN_OR_RETURN(int64_t available, available_memory_bytes());
  PD_TRY(check_memory_fits(plan_memory(config, nullptr, o.ctx_size), available, o.model_dir));
  PD_ASSIGN_OR_RETURN(s->checkpoint, load_checkpoint(o.model_dir));
  PD_TRY(check_memory_fits(plan_memory(s->checkpoint.config, &s->checkpoint.weights, o.ctx_size), available,
                           o.model_dir));
  PD_ASSIGN_OR_RETURN(s->backend, create_backend({.name = o.backend, .threads = o.threads}));
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
  PD_ASSIGN_OR_RETURN(s->generator, Generator::create(*s->model, {.ctx_size = o.ctx_size,
                                                                  .kv_dtype = o.kv_dtype,
                                                                  .max_draft = o.max_draft,
                                                                  .mtp = o.mtp}));
  return s;
}

}  // namespace pd
