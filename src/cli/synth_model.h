// Synthetic models for `puredrive synth` and `puredrive bench --synth`: the real shapes of a published
// architecture with random weights (speed only; docs/DESIGN.md §7). For the CUDA backend the matrices carry
// no host data: they point at registered SynthSources and the backend generates them in device memory
// (backend/cuda/synth_source.h). For the CPU backend they are materialised in host memory with the same
// generator, so both backends see the same weights.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "puredrive/model/model_config.h"
#include "puredrive/model/model_weights.h"
#include "puredrive/model/quantize.h"
#include "puredrive/util/status.h"

namespace pd::cli {

struct SynthSourceHolder;  // registered generator descriptions (synth_model.cpp)

// Bytes one non-speculative decode step must move, by kind (the floor's numerator).
struct StepBytes {
  int64_t dense = 0;  // every non-expert matrix a decode step reads, lm_head included (embedding: one row)
  int64_t experts_active = 0;  // top_k routed experts per layer
  int64_t kv_per_token = 0;    // K + V bytes per cached token over all full-attention layers
  int64_t gdn_state = 0;       // recurrent + conv state of all GDN layers, read and written once
  int64_t lm_head = 0;         // the output matrix (part of dense)
  // One draft step of the MTP head: its non-expert matrices (fc, attention, router, shared expert, one
  // embedding row; the shared lm_head not included), its top_k routed experts, K + V bytes per cached token.
  int64_t mtp_dense = 0;
  int64_t mtp_experts_active = 0;
  int64_t mtp_kv_per_token = 0;
  int64_t at_context(int64_t tokens) const {
    return dense + experts_active + gdn_state + kv_per_token * tokens;
  }
  // A draft step at `tokens` cached positions whose lm_head covers draft_vocab of vocab rows.
  int64_t mtp_at_context(int64_t tokens, int64_t draft_vocab, int64_t vocab) const {
    return mtp_dense + mtp_experts_active + mtp_kv_per_token * tokens + lm_head * draft_vocab / vocab;
  }
};

// The vision tower of the published checkpoint (qwen3_5_moe), written by `synth --write` and skipped by the
// loader.
struct VisionShape {
  int depth = 0, hidden = 0, intermediate = 0, heads = 0, patch = 0, temporal_patch = 0, merge = 0,
      positions = 0;
};

struct SynthModel {
  std::string arch, quant;
  uint64_t seed = 0;
  std::optional<QuantRecipe> recipe;  // unset: bf16
  int group_size = 0;                 // the recipe's global group size
  ModelConfig config;                 // the text model (qwen3_5_moe_text)
  std::string published_config;       // config.json as the published checkpoint has it (nested, with vision)
  VisionShape vision;
  ModelWeights weights;
  int64_t weight_bytes = 0;  // all matrices as stored
  StepBytes step_bytes;
  std::shared_ptr<SynthSourceHolder> sources;  // keeps the sources registered while the weights live
  std::deque<std::vector<uint8_t>> host;       // materialised matrices (CPU backend; stable addresses)

  SynthModel() = default;
  SynthModel(const SynthModel&) = delete;
  SynthModel& operator=(const SynthModel&) = delete;
};

// Architectures: "qwen3.5-35b-a3b" (spec §1.2), "tiny" (the same architecture at fixture size) and
// "tiny-wide-vocab" (tiny with a 151,936-token vocabulary, for a real tokenizer). Quantisations: bf16, or a
// `puredrive quantize` recipe (model/quantize.h) applied with its own rules: q8, q6, q4 (group 64 for the
// 35B, 32 for tiny; routers 8-bit group 64), oq6e (routed experts 6-bit, the rest 8-bit, group 64).
const std::vector<std::string>& synth_archs();
const std::vector<std::string>& synth_quants();

// materialize: generate host copies (CPU backend) instead of device-generated sources. layers > 0 keeps only
// the first `layers` decoder layers (the real widths in a checkpoint a few GB large).
Expected<std::unique_ptr<SynthModel>> make_synth_model(const std::string& arch, const std::string& quant,
                                                       uint64_t seed, bool materialize, int layers = 0);

// Token ids for prefill: seeded, uniform over the vocabulary.
std::vector<int32_t> synth_tokens(uint64_t seed, int vocab, int count);

}  // namespace pd::cli
