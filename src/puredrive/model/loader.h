// Checkpoint loader: config.json + safetensors -> ModelWeights in canonical engine order. This file knows the
// qwen3_5_moe / qwen3_next tensors and their shapes; finding, shape-checking and binding a tensor (float or
// MLX affine) is checkpoint/tensor_binder.h.
//
// Accepted layouts (docs/spec/qwen3_5_moe.md §2, §9): prefixes `model.*`, `model.language_model.*`,
// `language_model.model.*` (+ `language_model.lm_head`), MTP under `mtp.*`, `model.language_model.mtp.*` or
// `language_model.mtp.*`; routed experts fused 3-D (`experts.gate_up_proj` / `experts.down_proj`), per expert
// (`experts.{e}.gate_proj.weight` ...) or MLX-stacked (`switch_mlp.*`), always bound as per-expert views
// without copying; Qwen3-Next fused `in_proj_qkvz` / `in_proj_ba`, re-ordered at load into q|k|v, z, b, a;
// float or MLX affine matrices (a module is quantized iff its `.scales` exists). The vision tower is skipped
// with one notice.
//
// Zero-centred norms (§3): HF checkpoints store w and the loader folds 1 + w; MLX-sanitized checkpoints
// (conv1d stored [C, K, 1]; for the MTP head, experts stacked as switch_mlp) already store 1 + w.
// linear_attn.norm is a plain weight and is never shifted.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "puredrive/checkpoint/safetensors.h"
#include "puredrive/checkpoint/tensor_binder.h"
#include "puredrive/checkpoint/tensor_names.h"
#include "puredrive/model/model_config.h"
#include "puredrive/model/model_weights.h"
#include "puredrive/model/qkvz_reorder.h"
#include "puredrive/util/status.h"

namespace pd {

enum class NormLayout { kDetect, kHf, kMlxSanitized };

struct LoadOptions {
  bool load_mtp = true;          // false: mtp.* tensors are skipped (and not reported as unused)
  bool error_on_unused = false;  // unused tensors are an error instead of a warning
  NormLayout norm_layout = NormLayout::kDetect;
};

struct Checkpoint {
  std::string dir;
  // As parsed, except mtp_num_hidden_layers = the number of MTP layers actually bound (0 without a head).
  ModelConfig config;
  ModelWeights weights;
  std::vector<TensorListing> tensors;  // every stored tensor, by name ("layers.10" after "layers.9")
  std::vector<std::string> unused;     // stored names bound to nothing (vision tower excluded)
  std::vector<std::string> notices;    // one line each: vision tower skipped, MTP absent, ...
  bool norms_shifted_in_file = false;  // main model stored 1 + w (MLX-sanitized)
  std::string expert_layout;           // main layers: "fused", "per-expert" or "switch_mlp"
};

Expected<Checkpoint> load_checkpoint(const std::string& dir, const LoadOptions& options = {});
// Binds an already parsed config to an opened store (tests, tools).
Expected<Checkpoint> bind_checkpoint(const ModelConfig& config, TensorStore store,
                                     const LoadOptions& options = {});

}  // namespace pd
