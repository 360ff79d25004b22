// `puredrive synth --write DIR`: a synthetic model (synth_model.h) written as the published checkpoint would
// be, so that loading, serving and `bench --model` run on files at full scale without downloading weights.
//
// - bf16: the Hugging Face layout of Qwen3.5-35B-A3B: config.json with text_config and vision_config, tensors
//   `model.language_model.*`, `lm_head.weight`, `model.visual.*` (the vision tower, random) and `mtp.*`;
//   main-layer experts fused (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]), MTP experts
//   one by one; zero-centred norms stored as w (0), A_log and linear_attn.norm f32, the rest bf16; shards of
//   at most 5 GB named model.safetensors-0000i-of-0000n.safetensors with model.safetensors.index.json.
// - q8 / q6 / q4 / oq6e: mlx-lm's layout, planned by `puredrive quantize`'s own code (plan_quantization over
// the
//   bf16 layout's listing), so names, shapes, dtypes, shards and the `quantization` block are exactly what
//   quantize writes; the codes are the synthetic model's random words, not a quantization of bf16 values.
//
// The values are the in-memory model's (`synth`, `bench --synth`) for the same seed, bit for bit: the
// matrices come from the same counter-based generator and the vectors are stored in the dtype they were
// rounded to. Tensors are generated a few MB at a time on several threads and written in place, so memory
// stays small whatever the model size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/synth_model.h"
#include "puredrive/util/status.h"

namespace pd::cli {

struct SynthWriteOptions {
  std::string dir;
  std::string tokenizer_dir;  // tokenizer.json and tokenizer_config.json are copied from here ("": none)
  std::string chat_template;  // a Jinja file written as chat_template.jinja ("": none)
  int threads = 0;            // 0: all cores
  uint64_t max_shard_bytes = 5ull << 30;
  bool progress = true;
};

struct SynthWriteSummary {
  std::string layout;  // "hf" or "mlx"
  std::vector<std::string> files;
  size_t tensors = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  std::vector<std::string> notices;
};

// m must have been made with materialize = false (matrices are generator sources).
Expected<SynthWriteSummary> write_synth_checkpoint(const SynthModel& m, const SynthWriteOptions& options);

}  // namespace pd::cli
