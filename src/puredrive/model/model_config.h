// ModelConfig: the hyperparameters of a qwen3_5_moe / qwen3_5_moe_text / qwen3_next checkpoint, parsed from
// config.json and validated. Field names keep their config.json spelling (docs/spec/qwen3_5_moe.md §1).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "puredrive/checkpoint/affine.h"
#include "puredrive/util/status.h"

namespace pd {

enum class Arch { kQwen3_5Moe, kQwen3Next };
enum class LayerType { kLinearAttention, kFullAttention };

struct ModelConfig {
  std::string model_type;  // as written at the top level of config.json
  Arch arch = Arch::kQwen3_5Moe;
  std::string text_model_type;  // text_config.model_type for nested configs, else model_type
  bool has_vision = false;      // a vision_config is present (the tower itself is never loaded)
  std::string torch_dtype;      // "dtype" / "torch_dtype" as written ("bfloat16", ...), empty when absent

  int hidden_size = 0;
  int num_hidden_layers = 0;
  int vocab_size = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  int max_position_embeddings = 0;

  // Gated full attention.
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;
  bool attn_output_gate = true;
  double rope_theta = 10000.0;
  double partial_rotary_factor = 1.0;
  int rotary_dim = 0;  // head_dim * partial_rotary_factor
  std::string rope_type = "default";
  // Interleaved MRoPE sections over the rotary frequencies (Qwen3.5); text-only use reduces to 1-D RoPE.
  std::vector<int> mrope_section;
  bool mrope_interleaved = false;

  // Gated DeltaNet.
  int linear_num_key_heads = 0;
  int linear_num_value_heads = 0;
  int linear_key_head_dim = 0;
  int linear_value_head_dim = 0;
  int linear_conv_kernel_dim = 4;

  // MoE.
  int num_experts = 0;
  int num_experts_per_tok = 0;
  int moe_intermediate_size = 0;
  int shared_expert_intermediate_size = 0;
  bool norm_topk_prob = true;

  // MTP layers: mtp_num_hidden_layers (qwen3_5_moe) or num_nextn_predict_layers (qwen3_next). When neither is
  // written, mtp_layers_explicit is false and the loader uses 1 if the checkpoint holds mtp.* tensors.
  int mtp_num_hidden_layers = 0;
  bool mtp_layers_explicit = false;
  std::vector<LayerType> layer_types;  // one per decoder layer
  int full_attention_interval = 0;     // as written; 0 when absent (layer_types given)

  std::optional<QuantizationConfig> quantization;  // checkpoint/affine.h

  // Derived sizes.
  int key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
  int value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
  int conv_dim() const { return 2 * key_dim() + value_dim(); }
  bool is_linear(int layer) const { return layer_types[layer] == LayerType::kLinearAttention; }
  int num_full_attention_layers() const;
  int num_linear_attention_layers() const { return num_hidden_layers - num_full_attention_layers(); }
};

const char* arch_name(Arch a);
// "GDN GDN GDN ATTN ..."
std::string layer_plan_string(const ModelConfig& c);
// The model_type strings parse_model_config accepts.
const std::vector<std::string>& supported_model_types();

// Parses config.json text. `source` names the file in error messages.
Expected<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source);
Expected<ModelConfig> load_model_config(const std::string& model_dir);

}  // namespace pd
