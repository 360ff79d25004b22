// `puredrive quantize`: a float checkpoint (HF or MLX layout) -> an MLX affine checkpoint in mlx-lm's layout.
//
// The output is what mlx_lm.convert writes (tensor names, stacked `switch_mlp` experts, conv1d [C, K, 1],
// zero-centred norms stored as 1 + w, the `quantization` block with per-module overrides, codes and scales
// from MLX's own quantizer), plus the MTP head, which mlx-lm drops and which is kept here in the same layout
// and quantized by the same recipe. Conversion streams: every output tensor is planned first (names, shapes,
// offsets), then produced a few rows at a time from the memory-mapped input and written in place, so host
// memory stays bounded by small per-thread buffers whatever the model size.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "puredrive/checkpoint/safetensors.h"
#include "puredrive/checkpoint/sharded_writer.h"
#include "puredrive/model/model_config.h"
#include "puredrive/util/status.h"

namespace pd {

// q8/q6/q5/q4: every quantizable module at that width. oq6e: routed experts 6-bit, everything else 8-bit,
// group 64. In all recipes the router (`mlp.gate`) and `shared_expert_gate` get 8 bits, group 64: mlx-lm's
// own rule for these models (their quant_predicate), which keeps routing decisions close to the float
// model's.
enum class QuantRecipe { kQ8, kQ6, kQ5, kQ4, kOq6e };

Expected<QuantRecipe> parse_quant_recipe(const std::string& name);
const char* quant_recipe_name(QuantRecipe r);

// What a module is, for recipes and for reporting bits per weight.
enum class ModuleClass {
  kEmbedding,
  kLmHead,
  kAttention,
  kGdn,
  kRouter,  // mlp.gate and mlp.shared_expert_gate
  kSharedExpert,
  kRoutedExperts,
  kMtpFc,
  kOther,  // norms, conv1d, A_log, dt_bias: never quantized
};
const char* module_class_name(ModuleClass c);
// Class of a module from its canonical path (`model.layers.3.self_attn.q_proj`, `mtp.fc`, ...).
ModuleClass classify_module(const std::string& canonical_module);

// Bits and group size of a quantizable module under a recipe (group_size: the recipe's global group).
QuantParams recipe_params(QuantRecipe r, int group_size, ModuleClass c);
// The recipe's global parameters, written as the `quantization` block's bits / group_size.
QuantParams recipe_global(QuantRecipe r, int group_size);
// What the recipe does with a module of input width `cols`: its parameters, or nullopt when it stays in float
// (not quantizable, or `cols` not a multiple of the global group size (oq6e: 64) and of its own group).
std::optional<QuantParams> module_quant_params(QuantRecipe r, int group_size, ModuleClass c, int64_t cols);

// One unit of work: a quantized module (codes, scales, biases) or one float tensor copied (possibly
// re-stacked, re-shaped or with 1 + w folded in).
struct QuantJob {
  // Source rows, concatenated: each segment is `rows` consecutive rows of a source tensor viewed as
  // [numel / row_elems, row_elems].
  struct Segment {
    const TensorInfo* tensor = nullptr;
    int64_t first_row = 0;
    int64_t rows = 0;
  };
  std::string module;  // output module path (quantized) or output tensor name (float)
  ModuleClass cls = ModuleClass::kOther;
  std::vector<Segment> segments;
  int64_t row_elems = 0;  // source elements per row (= input width of a matrix)
  int64_t rows = 0;       // total rows
  DType src_dtype = DType::kF32;
  std::optional<QuantParams> quant;  // set: quantize; unset: copy
  bool add_one = false;         // zero-centred norm stored by HF as w: written as 1 + w (mlx-lm sanitize)
  std::vector<size_t> outputs;  // indices into QuantPlan::tensors: [weight] or [weight, scales, biases]
};

struct QuantPlan {
  std::vector<PlannedTensor> tensors;  // names as written (mlx-lm spelling)
  std::vector<QuantJob> jobs;
  // The `quantization` block: bits, group_size, mode and the per-module overrides (mlx-lm module paths).
  QuantParams global;
  std::map<std::string, QuantParams> overrides;
  std::vector<std::string> notices;  // skipped vision tower, modules left in float, ...
  uint64_t input_bytes = 0;
};

// Plans the conversion of a checkpoint whose config is `config` and tensors `store`. Validates that the input
// is a complete float checkpoint (the loader binds it) and that nothing is already quantized.
Expected<QuantPlan> plan_quantization(const ModelConfig& config, const TensorStore& store, QuantRecipe recipe,
                                      int group_size);

// config.json of the converted checkpoint: the input's (text), without vision_config, with the `quantization`
// block mlx-lm writes (and its copy under quantization_config).
Expected<std::string> mlx_config_text(const std::string& input_config, const QuantPlan& plan);

struct QuantizeProgress {
  size_t jobs_done = 0;
  size_t jobs_total = 0;
  uint64_t bytes_done = 0;  // input bytes consumed
  uint64_t bytes_total = 0;
};

struct QuantizeOptions {
  std::string model_dir;
  std::string out_dir;
  QuantRecipe recipe = QuantRecipe::kQ4;
  int group_size = 64;
  int threads = 0;                        // 0: all cores (the output is the same for any count)
  uint64_t max_shard_bytes = 5ull << 30;  // mlx-lm's shard size
  std::function<void(const QuantizeProgress&)>
      progress;  // called from the calling thread, a few times a second
};

struct QuantizeSummary {
  size_t tensors_written = 0;
  size_t modules_quantized = 0;
  uint64_t input_bytes = 0;  // every tensor of the input
  uint64_t read_bytes = 0;   // the input the jobs read (not the vision tower, nor a tied lm_head)
  uint64_t output_bytes = 0;
  int threads = 0;                  // threads that ran the jobs
  std::vector<std::string> files;   // weight files written, relative to out_dir
  std::vector<std::string> copied;  // tokenizer / template / generation config files copied
  std::vector<std::string> notices;
};

// Converts model_dir into out_dir (created; existing weight files there are replaced), writes config.json
// with the quantization block and copies the tokenizer, chat template and generation config files.
Expected<QuantizeSummary> quantize_checkpoint(const QuantizeOptions& options);

}  // namespace pd
