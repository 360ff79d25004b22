// ModelSession: everything `generate`, `check` and `serve` load from a model directory, in dependency order:
// backend -> checkpoint (mapped weights) -> model -> tokenizer (when tokenizer.json exists) -> generation
// defaults (EOS ids, sampling) -> generator. The backend comes first because its available memory sizes
// the context: the memory plan is computed from config.json before any weight is mapped, and again with
// the real weights. The chosen backend and the plan are logged. A model that does not fit is refused before
// any weight is read. Uploading the weights to a device reports its progress (a bar on a terminal, log lines
// otherwise) and its time.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "puredrive/backend/backend.h"
#include "puredrive/decode/generator.h"
#include "puredrive/decode/model_defaults.h"
#include "puredrive/model/loader.h"
#include "puredrive/model/memory_plan.h"
#include "puredrive/model/model.h"
#include "puredrive/tokenizer/tokenizer.h"

namespace pd {

inline constexpr int kMaxPrefillChunk = 16384;

struct SessionOptions {
  std::string model_dir;
  std::string backend = "auto";  // "auto": CUDA when a device is usable, else the CPU
  int threads = 0;               // CPU threads, <= 0: all cores
  int ctx_size = 0;              // 0: max_position_embeddings, or the largest context that fits
  DType kv_dtype = DType::kBF16;
  // Rows per prefill step (the model's max rows is at least max_draft + 1); 0: choose_prefill_chunk in
  // model/memory_plan.h. The step workspaces grow with it (step_workspace_bytes), and the memory plan leaves
  // room for them.
  int prefill_chunk = 0;
  int max_draft = 4;
  bool mtp = true;  // attach the MTP drafter when the checkpoint has a head
  // Draft-side approximations of the MTP head (ModelOptions, docs/DESIGN.md §4.8); 0: off.
  int mtp_draft_vocab = 0;
  int mtp_window = 0;  // the CPU backend only
};

struct ModelSession {
  Checkpoint checkpoint;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::optional<Tokenizer> tokenizer;
  GenerationDefaults defaults;
  std::unique_ptr<Generator> generator;
  MemoryPlan plan;  // plan.ctx_size is the context the generator holds
  // Wall time of open(): mapping and binding the checkpoint (`map`), then building the model on the backend,
  // which for a device means uploading every weight (`upload`).
  struct LoadTimes {
    double map_seconds = 0;
    double upload_seconds = 0;
    double total_seconds = 0;
  } load;

  static Expected<std::unique_ptr<ModelSession>> open(const SessionOptions& options);
};

}  // namespace pd
