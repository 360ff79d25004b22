// The bound weights of a qwen3_5_moe / qwen3_next model, in engine order and canonical names, pointing into
// the memory-mapped checkpoint (model/loader.h binds them and checks every shape against the config).
// Matrices stay in their stored format (f32/f16/bf16 or MLX affine); small vectors (norms, conv taps, gates'
// biases) are converted to f32 at load, with the zero-centred "+1" already folded in for HF-layout
// checkpoints (docs/spec/qwen3_5_moe.md §3).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "puredrive/backend/backend.h"
#include "puredrive/checkpoint/weights.h"
#include "puredrive/model/model_config.h"

namespace pd {

struct AttentionWeights {
  Matrix q_proj;              // [Hq * D * 2, H], per head [query | gate]
  Matrix k_proj;              // [Hkv * D, H]
  Matrix v_proj;              // [Hkv * D, H]
  Matrix o_proj;              // [H, Hq * D]
  std::vector<float> q_norm;  // [D], 1 + w folded
  std::vector<float> k_norm;  // [D], 1 + w folded
};

struct GdnWeights {
  Matrix in_proj_qkv;  // [2 * key_dim + value_dim, H], contiguous q | k | v (Qwen3-Next re-ordered at load)
  Matrix in_proj_z;    // [value_dim, H]
  Matrix in_proj_b;    // [Hv, H]
  Matrix in_proj_a;    // [Hv, H]
  std::vector<float> conv1d;   // [conv_dim, K] depthwise taps, tap K-1 multiplies the current token
  std::vector<float> dt_bias;  // [Hv]
  std::vector<float> A_log;    // [Hv]
  std::vector<float> norm;     // [Dv], plain weight (never shifted)
  Matrix out_proj;             // [H, value_dim]
};

struct LayerWeights {
  LayerType type = LayerType::kFullAttention;
  std::vector<float> input_layernorm;           // [H], 1 + w folded
  std::vector<float> post_attention_layernorm;  // [H], 1 + w folded
  AttentionWeights attn;                        // when type == kFullAttention
  GdnWeights gdn;                               // when type == kLinearAttention
  MoeWeights moe;                               // backend/backend.h
};

struct MtpWeights {
  Matrix fc;                                 // [H, 2H]: columns [0, H) embedding, [H, 2H) hidden
  std::vector<float> pre_fc_norm_embedding;  // [H], 1 + w folded
  std::vector<float> pre_fc_norm_hidden;     // [H], 1 + w folded
  std::vector<float> norm;                   // [H], 1 + w folded
  std::vector<LayerWeights> layers;          // mtp_num_hidden_layers full-attention + MoE layers
};

struct ModelWeights {
  Matrix embed_tokens;  // [V, H]
  std::vector<LayerWeights> layers;
  std::vector<float> norm;  // final norm [H], 1 + w folded
  Matrix lm_head;           // [V, H] (the embedding when tie_word_embeddings)
  std::optional<MtpWeights> mtp;

  // Keeps mapped files and load-time buffers (re-ordered or converted tensors) alive.
  std::vector<std::shared_ptr<const void>> storage;
};

}  // namespace pd
