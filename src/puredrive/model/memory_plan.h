// Parameter counts and the memory / bandwidth plan of a model (docs/DESIGN.md §5, §8): what must be resident
// (weights, bf16 KV cache for --ctx-size, GDN conv + fp32 recurrent state) and how many bytes one decode step
// moves, which bounds tokens per second by memory bandwidth.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "puredrive/model/model_config.h"
#include "puredrive/model/model_weights.h"
#include "puredrive/util/status.h"

namespace pd {

// Every weight of the architecture as the config describes it, under canonical module paths.
struct ModuleSpec {
  enum class Role { kEmbedding, kLmHead, kDense, kExpert, kVector };
  std::string path;  // canonical module path, e.g. "model.layers.3.self_attn.q_proj"
  int64_t rows = 0;
  int64_t cols = 0;    // 1 for vectors
  int64_t copies = 1;  // num_experts for stacked expert projections
  Role role = Role::kDense;
  bool mtp = false;
  int64_t numel() const { return rows * cols * copies; }
};
std::vector<ModuleSpec> module_catalogue(const ModelConfig& c);

struct ParamCounts {
  int64_t embedding = 0;  // embed_tokens
  int64_t lm_head = 0;    // 0 when tied to the embedding
  int64_t dense = 0;    // main layers: attention, GDN, routers, shared experts, norms, conv taps; final norm
  int64_t experts = 0;  // routed experts of the main layers
  int64_t mtp = 0;      // MTP head (shares embedding and lm_head)
  // Read per decode token: lm_head (or the tied embedding), dense, one embedding row; plus top-k experts.
  int64_t active_dense = 0;
  int64_t active_experts = 0;

  int64_t main() const { return embedding + lm_head + dense + experts; }
  int64_t total() const { return main() + mtp; }
  int64_t active() const { return active_dense + active_experts; }
};
ParamCounts count_parameters(const ModelConfig& c);

struct MemoryPlan {
  ParamCounts params;
  int64_t ctx_size = 0;
  bool from_weights = false;  // byte figures measured on loaded weights; else estimated from config.json
  int64_t weight_bytes = 0;   // resident weights incl. the MTP head (vectors as f32)
  int64_t dense_bytes_per_token = 0;   // non-expert weights read by one decode step
  int64_t expert_bytes_per_token = 0;  // top-k routed experts of every main layer
  int64_t kv_bytes_per_token = 0;      // bf16 K and V of the main full-attention layers
  int64_t mtp_kv_bytes_per_token = 0;  // bf16 K and V of the MTP layers
  int64_t gdn_conv_bytes = 0;          // per sequence: conv window, bf16 [conv_dim, K-1] per GDN layer
  int64_t gdn_recurrent_bytes = 0;     // per sequence: fp32 [Hv, dk, dv] per GDN layer

  int64_t kv_bytes() const { return (kv_bytes_per_token + mtp_kv_bytes_per_token) * ctx_size; }
  int64_t state_bytes() const { return gdn_conv_bytes + gdn_recurrent_bytes; }
  int64_t total_bytes() const { return weight_bytes + kv_bytes() + state_bytes(); }
  // Bytes one plain decode step moves with `context` cached tokens: weights read once, the main layers' KV
  // read, GDN conv and recurrent state read and written back.
  int64_t bytes_per_decode_token(int64_t context) const;
};

// `weights` may be null (config-only): matrix bytes are then estimated from torch_dtype or the quantization
// block (bits + 32 / group_size bits per weight for bf16 scales and biases, per-module overrides honoured).
MemoryPlan plan_memory(const ModelConfig& c, const ModelWeights* weights, int64_t ctx_size);

// H200 measured device-to-device copy bandwidth (docs/DESIGN.md §8), used for the floor example.
inline constexpr double kH200CopyBandwidth = 4.28e12;

// MemAvailable from /proc/meminfo, in bytes.
Expected<int64_t> available_memory_bytes();
// kOutOfMemory with the plan's breakdown when total_bytes() exceeds `available`.
Status check_memory_fits(const MemoryPlan& plan, int64_t available, const std::string& where);

// The plan a session runs with. `requested` > 0: that context, or kOutOfMemory when it does not fit. 0: the
// model's max_position_embeddings when it fits, else the largest context that fits (found by planning, so
// it stays right whatever the plan counts). kOutOfMemory naming the sizes when the weights and state alone
// leave no room for a context of 2 tokens.
Expected<MemoryPlan> plan_context(const ModelConfig& c, const ModelWeights* weights, int64_t requested,
                                  int64_t available, const std::string& where);
// Device memory that steps of up to `rows` rows use besides the plan: the model's workspaces (logits for
// `logit_rows` rows, the MTP head's included) and the MoE scratch of a prefill step (router logits, expert
// lists, activations and outputs for every (row, expert) pair), plus the MTP drafter's pending rows.
// Estimated from the config; grows linearly with the prefill chunk.
int64_t step_workspace_bytes(const ModelConfig& c, int64_t rows, int64_t logit_rows);

// Rows per prefill step when the user gives none. A GPU's prefill products read every weight once per step
// (all experts, at a few dozen rows each), so larger steps pay: an 8K prompt of the synthetic 35B in 2048-,
// 4096- and 8192-row steps ran at 17.9K, 20.1K and 21.3K tok/s on the H200 (docs/DESIGN.md §8). So a GPU
// takes 8192 rows when the plan for `ctx` (0: max_position_embeddings) fits in `available` beside their
// workspace and `other_workspace`, else 4096, else 2048; the CPU 2048 (larger steps only cost memory there).
inline constexpr int kSmallPrefillChunk = 2048;
int choose_prefill_chunk(const ModelConfig& c, bool gpu, int64_t ctx, int64_t available,
                         int64_t other_workspace, int logit_rows);

// "weights 1.94 GB, KV cache 2.0 GB (32768 tokens), state 1.2 MB, total ..." for startup lines.
std::string describe_plan(const MemoryPlan& plan);

// "1.94 GB", "20.0 KiB" style helpers for reports.
std::string format_bytes(double bytes);
std::string format_count(double n);  // "34.66B", "512.0M"

}  // namespace pd
