// The bound weights of a model, in engine order and canonical names, pointing into the memory-mapped
// checkpoint. Matrices stay in their stored format (f32/f16/bf16 or MLX affine); small vectors (norms,
// conv taps, gates' biases) are converted to f32 at load, with the zero-centred "+1" already folded in
// for HF-layout checkpoints (docs/spec/qwen3_5_moe.md §3).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "puredrive/checkpoint/model_config.h"
#include "puredrive/util/dtype.h"

namespace pd {

enum class WeightFormat { kF32, kF16, kBF16, kAffine };

const char* weight_format_name(WeightFormat f);

// A 2-D weight W[rows = out, cols = in] used as y = x * W^T. Non-owning view into mapped or owned memory.
struct Matrix {
  WeightFormat format = WeightFormat::kF32;
  int64_t rows = 0;
  int64_t cols = 0;            // logical input width (unpacked)
  const void* data = nullptr;  // dense: rows*cols elements row-major; affine: rows x (cols*bits/32) uint32
  // MLX affine only: w = scale * q + bias per group of group_size consecutive columns.
  int bits = 0;
  int group_size = 0;
  DType scale_dtype = DType::kBF16;  // dtype of scales and biases
  const void* scales = nullptr;      // [rows, cols/group_size]
  const void* biases = nullptr;      // [rows, cols/group_size]
  std::string name;                  // canonical name, for error messages

  bool empty() const { return data == nullptr; }
  // Bytes read by one full pass over the matrix (codes + scales + biases for affine).
  int64_t nbytes() const;
  // Row r dequantised to f32 (reference path and tests; backends use their own kernels).
  void dequantize_row(int64_t r, float* out) const;
  // A view of rows [begin, begin + count).
  Matrix row_slice(int64_t begin, int64_t count) const;
};

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

struct MoeWeights {
  Matrix gate;                    // router [E, H]
  std::vector<Matrix> gate_proj;  // per expert [I, H]
  std::vector<Matrix> up_proj;    // per expert [I, H]
  std::vector<Matrix> down_proj;  // per expert [H, I]
  Matrix shared_gate_proj;        // [Is, H]
  Matrix shared_up_proj;          // [Is, H]
  Matrix shared_down_proj;        // [H, Is]
  Matrix shared_expert_gate;      // [1, H]
};

struct LayerWeights {
  LayerType type = LayerType::kFullAttention;
  std::vector<float> input_layernorm;           // [H], 1 + w folded
  std::vector<float> post_attention_layernorm;  // [H], 1 + w folded
  AttentionWeights attn;                        // when type == kFullAttention
  GdnWeights gdn;                               // when type == kLinearAttention
  MoeWeights moe;
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
