// qwen3_5_moe (Qwen3.5/3.6-35B-A3B and larger) and qwen3_next (Qwen3-Next-80B-A3B): hybrid Gated DeltaNet +
// gated full attention decoder layers, every layer with a sparse MoE FFN, plus the MTP head. The two families
// differ only in checkpoint layout, which the loader normalises, and in norm_topk_prob
// (docs/spec/qwen3_5_moe.md).
#pragma once

#include <memory>

#include "puredrive/model/model.h"

namespace pd {

Expected<std::unique_ptr<Model>> create_qwen3_5_moe(const ModelConfig& config, const ModelWeights& weights,
                                                    Backend& backend, const ModelOptions& options);

// The state each layer needs: KV per full-attention layer (and per MTP layer), conv + recurrent per GDN
// layer.
CacheSpec qwen3_5_moe_cache_spec(const ModelConfig& config, int mtp_layers);

}  // namespace pd
