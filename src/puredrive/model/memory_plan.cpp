#include "puredrive/model/memory_plan.h"

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "puredrive/checkpoint/affine.h"
#include "puredrive/model/loader.h"

namespace pd {
namespace {

using Role = ModuleSpec::Role;

void add_layer(const ModelConfig& c, const std::string& p, LayerType type, bool mtp,
               std::vector<ModuleSpec>* out) {
  const int64_t H = c.hidden_size, D = c.head_dim, E = c.num_experts, I = c.moe_intermediate_size;
  const int64_t Is = c.shared_expert_intermediate_size;
  auto dense = [&](const std::string& name, int64_t rows, int64_t cols) {
    out->push_back({p + name, rows, cols, 1, Role::kDense, mtp});
  };
  auto vec = [&](const std::string& name, int64_t n) {
    out->push_back({p + name, n, 1, 1, Role::kVector, mtp});
  };
  vec("input_layernorm", H);
  vec("post_attention_layernorm", H);
  if (type == LayerType::kFullAttention) {
    dense("self_attn.q_proj", c.num_attention_heads * D * (c.attn_output_gate ? 2 : 1), H);
    dense("self_attn.k_proj", c.num_key_value_heads * D, H);
    dense("self_attn.v_proj", c.num_key_value_heads * D, H);
    dense("self_attn.o_proj", H, c.num_attention_heads * D);
    vec("self_attn.q_norm", D);
    vec("self_attn.k_norm", D);
  } else {
    const int64_t Hv = c.linear_num_value_heads;
    if (c.arch == Arch::kQwen3Next) {
      dense("linear_attn.in_proj_qkvz", c.conv_dim() + c.value_dim(), H);
      dense("linear_attn.in_proj_ba", 2 * Hv, H);
    } else {
      dense("linear_attn.in_proj_qkv", c.conv_dim(), H);
      dense("linear_attn.in_proj_z", c.value_dim(), H);
      dense("linear_attn.in_proj_b", Hv, H);
      dense("linear_attn.in_proj_a", Hv, H);
    }
    vec("linear_attn.conv1d", static_cast<int64_t>(c.conv_dim()) * c.linear_conv_kernel_dim);
    vec("linear_attn.dt_bias", Hv);
    vec("linear_attn.A_log", Hv);
    vec("linear_attn.norm", c.linear_value_head_dim);
    dense("linear_attn.out_proj", H, c.value_dim());
  }
  dense("mlp.gate", E, H);
  // MLX names the stacked experts switch_mlp; the quantization overrides use that path.
  out->push_back({p + "mlp.switch_mlp.gate_proj", I, H, E, Role::kExpert, mtp});
  out->push_back({p + "mlp.switch_mlp.up_proj", I, H, E, Role::kExpert, mtp});
  out->push_back({p + "mlp.switch_mlp.down_proj", H, I, E, Role::kExpert, mtp});
  dense("mlp.shared_expert.gate_proj", Is, H);
  dense("mlp.shared_expert.up_proj", Is, H);
  dense("mlp.shared_expert.down_proj", H, Is);
  dense("mlp.shared_expert_gate", 1, H);
}

// Estimated bytes of one matrix element from config.json alone.
double config_bytes_per_weight(const ModelConfig& c, const std::map<std::string, QuantParams>& overrides,
                               const ModuleSpec& m) {
  if (m.role == Role::kVector) return 4.0;  // held as f32 after load
  if (c.quantization) {
    QuantParams q = c.quantization->global;
    if (auto it = overrides.find(m.path); it != overrides.end()) q = it->second;
    if (q.bits > 0 && m.cols % q.group_size == 0) return (q.bits + 32.0 / q.group_size) / 8.0;
  }
  if (c.torch_dtype == "float32") return 4.0;
  return 2.0;  // bfloat16 / float16, the published dtype of these models
}

int64_t vec_bytes(const std::vector<float>& v) {
  return static_cast<int64_t>(v.size()) * 4;
}

struct LayerBytes {
  int64_t dense = 0;
  int64_t experts = 0;     // all experts
  int64_t active_exp = 0;  // top-k share
};

LayerBytes layer_bytes(const LayerWeights& l, int k) {
  LayerBytes b;
  b.dense += vec_bytes(l.input_layernorm) + vec_bytes(l.post_attention_layernorm);
  if (l.type == LayerType::kFullAttention) {
    const auto& a = l.attn;
    b.dense += a.q_proj.nbytes() + a.k_proj.nbytes() + a.v_proj.nbytes() + a.o_proj.nbytes() +
               vec_bytes(a.q_norm) + vec_bytes(a.k_norm);
  } else {
    const auto& g = l.gdn;
    b.dense += g.in_proj_qkv.nbytes() + g.in_proj_z.nbytes() + g.in_proj_b.nbytes() + g.in_proj_a.nbytes() +
               vec_bytes(g.conv1d) + vec_bytes(g.dt_bias) + vec_bytes(g.A_log) + vec_bytes(g.norm) +
               g.out_proj.nbytes();
  }
  const auto& m = l.moe;
  b.dense += m.gate.nbytes() + m.shared_gate_proj.nbytes() + m.shared_up_proj.nbytes() +
             m.shared_down_proj.nbytes() + m.shared_expert_gate.nbytes();
  for (size_t e = 0; e < m.gate_proj.size(); ++e) {
    b.experts += m.gate_proj[e].nbytes() + m.up_proj[e].nbytes() + m.down_proj[e].nbytes();
  }
  // Experts may differ in size (mixed recipes); k experts of mean size.
  if (!m.gate_proj.empty()) b.active_exp = b.experts * k / static_cast<int64_t>(m.gate_proj.size());
  return b;
}

}  // namespace

std::vector<ModuleSpec> module_catalogue(const ModelConfig& c) {
  std::vector<ModuleSpec> out;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  out.push_back({"model.embed_tokens", V, H, 1, Role::kEmbedding, false});
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    add_layer(c, fmt::format("model.layers.{}.", i), c.layer_types[i], false, &out);
  }
  out.push_back({"model.norm", H, 1, 1, Role::kVector, false});
  if (!c.tie_word_embeddings) out.push_back({"lm_head", V, H, 1, Role::kLmHead, false});
  if (c.mtp_num_hidden_layers > 0) {
    out.push_back({"mtp.fc", H, 2 * H, 1, Role::kDense, true});
    for (const char* n : {"mtp.pre_fc_norm_embedding", "mtp.pre_fc_norm_hidden", "mtp.norm"}) {
      out.push_back({n, H, 1, 1, Role::kVector, true});
    }
    for (int j = 0; j < c.mtp_num_hidden_layers; ++j) {
      add_layer(c, fmt::format("mtp.layers.{}.", j), LayerType::kFullAttention, true, &out);
    }
  }
  return out;
}

ParamCounts count_parameters(const ModelConfig& c) {
  ParamCounts p;
  for (const auto& m : module_catalogue(c)) {
    if (m.mtp) {
      p.mtp += m.numel();
      continue;
    }
    switch (m.role) {
      case Role::kEmbedding:
        p.embedding += m.numel();
        break;
      case Role::kLmHead:
        p.lm_head += m.numel();
        break;
      case Role::kDense:
      case Role::kVector:
        p.dense += m.numel();
        break;
      case Role::kExpert:
        p.experts += m.numel();
        p.active_experts += m.rows * m.cols * c.num_experts_per_tok;
        break;
    }
  }
  // The logits read the whole lm_head (the embedding when tied); the input reads one embedding row.
  p.active_dense = p.dense + (c.tie_word_embeddings ? p.embedding : p.lm_head + c.hidden_size);
  return p;
}

int64_t MemoryPlan::bytes_per_decode_token(int64_t context) const {
  return dense_bytes_per_token + expert_bytes_per_token + kv_bytes_per_token * context + 2 * state_bytes();
}

MemoryPlan plan_memory(const ModelConfig& c, const ModelWeights* weights, int64_t ctx_size) {
  MemoryPlan plan;
  plan.params = count_parameters(c);
  plan.ctx_size = ctx_size;
  const int64_t kv_per_layer =
      2 * static_cast<int64_t>(c.num_key_value_heads) * c.head_dim * 2;  // K and V, bf16
  plan.kv_bytes_per_token = kv_per_layer * c.num_full_attention_layers();
  plan.mtp_kv_bytes_per_token = kv_per_layer * c.mtp_num_hidden_layers;
  const int64_t gdn = c.num_linear_attention_layers();
  plan.gdn_conv_bytes = gdn * c.conv_dim() * static_cast<int64_t>(c.linear_conv_kernel_dim - 1) * 2;
  plan.gdn_recurrent_bytes = gdn * static_cast<int64_t>(c.linear_num_value_heads) * c.linear_key_head_dim *
                             c.linear_value_head_dim * 4;

  if (weights == nullptr) {
    std::map<std::string, QuantParams> overrides;
    if (c.quantization) {
      for (const auto& [key, q] : c.quantization->overrides) {
        std::string k = canonical_tensor_name(key + ".");
        if (!k.empty()) k.pop_back();
        overrides[k] = q;
      }
    }
    double total = 0, dense = 0, experts = 0;
    for (const auto& m : module_catalogue(c)) {
      const double b = config_bytes_per_weight(c, overrides, m) * static_cast<double>(m.numel());
      total += b;
      if (m.mtp) continue;
      switch (m.role) {
        case Role::kEmbedding:
          dense += c.tie_word_embeddings ? b : b / static_cast<double>(m.rows);
          break;
        case Role::kExpert:
          experts += b * c.num_experts_per_tok / static_cast<double>(m.copies);
          break;
        default:
          dense += b;
          break;
      }
    }
    plan.weight_bytes = static_cast<int64_t>(std::llround(total));
    plan.dense_bytes_per_token = static_cast<int64_t>(std::llround(dense));
    plan.expert_bytes_per_token = static_cast<int64_t>(std::llround(experts));
    return plan;
  }

  plan.from_weights = true;
  const ModelWeights& w = *weights;
  const int k = c.num_experts_per_tok;
  const bool tied = w.lm_head.data == w.embed_tokens.data;
  int64_t total = w.embed_tokens.nbytes() + (tied ? 0 : w.lm_head.nbytes()) + vec_bytes(w.norm);
  int64_t dense =
      w.lm_head.nbytes() + vec_bytes(w.norm) + (tied ? 0 : w.embed_tokens.nbytes() / w.embed_tokens.rows);
  int64_t experts = 0;
  for (const auto& l : w.layers) {
    const LayerBytes b = layer_bytes(l, k);
    total += b.dense + b.experts;
    dense += b.dense;
    experts += b.active_exp;
  }
  if (w.mtp) {
    total += w.mtp->fc.nbytes() + vec_bytes(w.mtp->pre_fc_norm_embedding) +
             vec_bytes(w.mtp->pre_fc_norm_hidden) + vec_bytes(w.mtp->norm);
    for (const auto& l : w.mtp->layers) {
      const LayerBytes b = layer_bytes(l, k);
      total += b.dense + b.experts;
    }
  }
  plan.weight_bytes = total;
  plan.dense_bytes_per_token = dense;
  plan.expert_bytes_per_token = experts;
  return plan;
}

Expected<int64_t> available_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  if (!f) return make_error(ErrorCode::kIo, "/proc/meminfo: cannot open");
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream ss(line);
    std::string key, unit;
    int64_t value = 0;
    ss >> key >> value >> unit;
    if (key == "MemAvailable:") return value * (unit == "kB" ? 1024 : 1);
  }
  return make_error(ErrorCode::kIo, "/proc/meminfo: no MemAvailable line");
}

int64_t step_workspace_bytes(const ModelConfig& c, int64_t rows, int64_t logit_rows) {
  const int64_t H = c.hidden_size, q = int64_t{c.num_attention_heads} * c.head_dim;
  const int64_t kv = int64_t{c.num_key_value_heads} * c.head_dim;
  const int64_t E = c.num_experts, K = c.num_experts_per_tok;
  const int64_t I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
  const bool mtp = c.mtp_num_hidden_layers > 0 || !c.mtp_layers_explicit;
  // Per row, in floats: ids and positions; residual, normed input, hidden; attention q|gate, k, v, output;
  // GDN projections and output; MTP fc input, hidden and the drafter's pending hidden.
  int64_t per_row = 2 + 3 * H + 3 * q + 2 * kv;
  if (c.num_linear_attention_layers() > 0) {
    per_row += c.conv_dim() + 2 * int64_t{c.value_dim()} + 2 * int64_t{c.linear_num_value_heads};
  }
  if (mtp) per_row += 4 * H;
  // MoE prefill scratch (backend/cuda/moe_grouped.cu): router logits and the expert lists, the shared gate,
  // selections and weights, activations and outputs of every selected expert and of the shared one.
  per_row += 2 * E + 1 + 2 * K + K * (I + H) + Is + H;
  // The wgmma products' bf16 hi and lo copies of their inputs (backend/cuda/gemm_tma.cu), one scratch sized
  // for the largest: the gate/up job's gathered rows, padded to 64 per expert, and the shared expert's rows.
  const int64_t tma_copies = (K + 1) * H * rows + 64 * E * H;
  const int64_t logits = logit_rows * c.vocab_size * (mtp ? 2 : 1);
  return 4 * (per_row * rows + tma_copies + logits);
}

int choose_prefill_chunk(const ModelConfig& c, bool gpu, int64_t ctx, int64_t available,
                         int64_t other_workspace, int logit_rows) {
  if (!gpu) return kSmallPrefillChunk;
  const int64_t plan = plan_memory(c, nullptr, ctx > 0 ? ctx : c.max_position_embeddings).total_bytes();
  for (const int rows : {4 * kSmallPrefillChunk, 2 * kSmallPrefillChunk}) {
    if (plan + other_workspace + step_workspace_bytes(c, rows, logit_rows) <= available) return rows;
  }
  return kSmallPrefillChunk;
}

Expected<MemoryPlan> plan_context(const ModelConfig& c, const ModelWeights* weights, int64_t requested,
                                  int64_t available, const std::string& where) {
  constexpr int64_t kMinContext = 2;
  if (requested != 0 && requested < kMinContext) {
    return make_error(ErrorCode::kInvalidArgument,
                      "--ctx-size must be at least {} (0: from the model), got {}", kMinContext, requested);
  }
  if (requested > 0) {
    MemoryPlan plan = plan_memory(c, weights, requested);
    PD_TRY(check_memory_fits(plan, available, where));
    return plan;
  }
  const int64_t max_context = c.max_position_embeddings;
  if (max_context < kMinContext) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: config.json gives no max_position_embeddings to size the context; pass --ctx-size",
                      where);
  }
  MemoryPlan plan = plan_memory(c, weights, max_context);
  if (plan.total_bytes() <= available) return plan;
  const MemoryPlan smallest = plan_memory(c, weights, kMinContext);
  if (smallest.total_bytes() > available) {
    return make_error(
        ErrorCode::kOutOfMemory,
        "{}: the weights alone need {} (plus GDN state {}) but only {} is available; use a smaller "
        "or quantized checkpoint",
        where, format_bytes(static_cast<double>(smallest.weight_bytes)),
        format_bytes(static_cast<double>(smallest.state_bytes())),
        format_bytes(static_cast<double>(available)));
  }
  // Invariant: lo fits, hi does not.
  int64_t lo = kMinContext, hi = max_context;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (plan_memory(c, weights, mid).total_bytes() <= available) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return plan_memory(c, weights, lo);
}

std::string describe_plan(const MemoryPlan& plan) {
  return fmt::format("weights {}, KV cache {} ({} tokens), state {}, total {}{}",
                     format_bytes(static_cast<double>(plan.weight_bytes)),
                     format_bytes(static_cast<double>(plan.kv_bytes())), plan.ctx_size,
                     format_bytes(static_cast<double>(plan.state_bytes())),
                     format_bytes(static_cast<double>(plan.total_bytes())),
                     plan.from_weights ? "" : " (estimated from config.json)");
}

Status check_memory_fits(const MemoryPlan& plan, int64_t available, const std::string& where) {
  if (plan.total_bytes() <= available) return Status::ok();
  return make_error(
      ErrorCode::kOutOfMemory,
      "{}: the plan needs {} (weights {}, KV cache {} for --ctx-size {}, GDN state {}) but only {} is "
      "available; lower --ctx-size or use a smaller or quantized checkpoint",
      where, format_bytes(static_cast<double>(plan.total_bytes())),
      format_bytes(static_cast<double>(plan.weight_bytes)),
      format_bytes(static_cast<double>(plan.kv_bytes())), plan.ctx_size,
      format_bytes(static_cast<double>(plan.state_bytes())), format_bytes(static_cast<double>(available)));
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.2f} {}", bytes, units[u]);
}

std::string format_count(double n) {
  if (std::fabs(n) >= 1e9) return fmt::format("{:.2f}B", n / 1e9);
  if (std::fabs(n) >= 1e6) return fmt::format("{:.1f}M", n / 1e6);
  if (std::fabs(n) >= 1e3) return fmt::format("{:.1f}K", n / 1e3);
  return fmt::format("{:.0f}", n);
}

}  // namespace pd
