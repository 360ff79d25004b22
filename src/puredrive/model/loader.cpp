#include "puredrive/model/loader.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "puredrive/checkpoint/tensor_binder.h"
#include "puredrive/model/qkvz_reorder.h"
#include "puredrive/util/log.h"

namespace pd {
namespace {

// The qwen3_5_moe / qwen3_next half of binding: which tensors make up the model, in which layouts, and the
// shape of each as the config implies; TensorBinder checks them and binds.
class Binder {
 public:
  Binder(const ModelConfig& config, const TensorStore& store, const LoadOptions& options, Checkpoint* out)
      : c_(config),
        store_(store),
        opt_(options),
        out_(out),
        t_(store, out->dir, config.quantization ? &*config.quantization : nullptr, &out->weights.storage) {}

  Status run();

 private:
  void detect_layouts();
  Status bind_layer(const std::string& p, LayerType type, bool shifted, LayerWeights* w);
  Status bind_attention(const std::string& p, bool shifted, AttentionWeights* w);
  Status bind_gdn(const std::string& p, GdnWeights* w);
  Status bind_moe(const std::string& p, MoeWeights* w);
  Status bind_experts(const std::string& p, MoeWeights* w, std::string* layout);
  Status bind_mtp();
  void finish_listing();

  bool has(const std::string& cname) const { return t_.has(cname); }
  std::string display(const std::string& cname) const { return t_.display(cname); }
  Expected<Matrix> matrix(const std::string& m, const std::vector<int64_t>& lead, int64_t rows,
                          int64_t cols) {
    return t_.matrix(m, lead, rows, cols);
  }
  Expected<std::vector<float>> vec(const std::string& name, int64_t len, bool zero_centred, bool shifted);
  Expected<std::vector<float>> conv(const std::string& name, int64_t channels, int64_t taps);

  const ModelConfig& c_;
  const TensorStore& store_;
  const LoadOptions& opt_;
  Checkpoint* out_;
  TensorBinder t_;
  std::optional<bool> conv_mlx_layout_;  // from the first conv1d: [C, K, 1] (MLX) or [C, 1, K] (HF)
  bool main_shifted_ = false;
  bool mtp_shifted_ = false;
  bool skip_mtp_ = false;
};

// spec §3: an MLX-sanitized checkpoint stores conv1d as [C, K, 1] and norms as 1 + w; HF stores [C, 1, K] and
// w.
void Binder::detect_layouts() {
  std::optional<bool> main;
  for (int i = 0; i < c_.num_hidden_layers && !main; ++i) {
    const TensorInfo* t = t_.find(fmt::format("model.layers.{}.linear_attn.conv1d.weight", i));
    if (t == nullptr || t->shape.size() != 3) continue;
    const auto& s = t->shape;
    if (s[1] == 1 && s[2] != 1) main = false;
    if (s[2] == 1 && s[1] != 1) main = true;
  }
  conv_mlx_layout_ = main;
  if (!main) main = has("model.layers.0.mlp.switch_mlp.gate_proj.weight");
  main_shifted_ = *main;
  mtp_shifted_ = has("mtp.layers.0.mlp.switch_mlp.gate_proj.weight");
  if (opt_.norm_layout != NormLayout::kDetect) {
    main_shifted_ = mtp_shifted_ = opt_.norm_layout == NormLayout::kMlxSanitized;
  }
  out_->norms_shifted_in_file = main_shifted_;
}

Expected<std::vector<float>> Binder::vec(const std::string& name, int64_t len, bool zero_centred,
                                         bool shifted) {
  const TensorInfo* t = t_.find(name);
  if (t == nullptr) return t_.missing(name, {len});
  if (t->shape != std::vector<int64_t>{len}) return t_.wrong_shape(name, {len}, t->shape);
  const bool add_one = zero_centred && !shifted;
  return t_.floats(name, add_one,
                   add_one        ? "norm, 1+w folded -> f32"
                   : zero_centred ? "norm (file has 1+w) -> f32"
                                  : "vector -> f32");
}

Expected<std::vector<float>> Binder::conv(const std::string& name, int64_t channels, int64_t taps) {
  const TensorInfo* t = t_.find(name);
  if (t == nullptr) return t_.missing(name, {channels, 1, taps});
  const std::vector<int64_t> hf{channels, 1, taps}, mlx{channels, taps, 1};
  // Both layouts hold the taps of a channel contiguously, so one read serves either.
  if (t->shape != hf && t->shape != mlx) {
    return t_.wrong_shape(name, hf, t->shape, " (or MLX layout [C, K, 1])");
  }
  if (taps > 1 && conv_mlx_layout_ && (t->shape == mlx) != *conv_mlx_layout_) {
    return make_error(
        ErrorCode::kInvalidArgument,
        "{}: '{}' is stored {} but the first GDN layer's conv1d uses the {} layout; mixed layouts are "
        "refused because the layout decides whether norms get +1",
        out_->dir, t->name, format_shape(t->shape), *conv_mlx_layout_ ? "MLX [C, K, 1]" : "HF [C, 1, K]");
  }
  return t_.floats(name, false, "conv taps -> f32");
}

Status Binder::bind_attention(const std::string& p, bool shifted, AttentionWeights* w) {
  const int64_t H = c_.hidden_size, D = c_.head_dim;
  const int64_t q_rows = c_.num_attention_heads * D * (c_.attn_output_gate ? 2 : 1);
  const int64_t kv_rows = c_.num_key_value_heads * D;
  PD_ASSIGN_OR_RETURN(w->q_proj, matrix(p + "self_attn.q_proj", {}, q_rows, H));
  PD_ASSIGN_OR_RETURN(w->k_proj, matrix(p + "self_attn.k_proj", {}, kv_rows, H));
  PD_ASSIGN_OR_RETURN(w->v_proj, matrix(p + "self_attn.v_proj", {}, kv_rows, H));
  PD_ASSIGN_OR_RETURN(w->o_proj, matrix(p + "self_attn.o_proj", {}, H, c_.num_attention_heads * D));
  PD_ASSIGN_OR_RETURN(w->q_norm, vec(p + "self_attn.q_norm.weight", D, true, shifted));
  PD_ASSIGN_OR_RETURN(w->k_norm, vec(p + "self_attn.k_norm.weight", D, true, shifted));
  return Status::ok();
}

Status Binder::bind_gdn(const std::string& p, GdnWeights* w) {
  const int64_t H = c_.hidden_size, Hk = c_.linear_num_key_heads, Hv = c_.linear_num_value_heads;
  const int64_t dk = c_.linear_key_head_dim, dv = c_.linear_value_head_dim;
  const std::string a = p + "linear_attn.";
  if (has(a + "in_proj_qkvz.weight") || has(a + "in_proj_qkvz")) {
    const int64_t r = Hv / Hk;
    PD_ASSIGN_OR_RETURN(Matrix qkvz, matrix(a + "in_proj_qkvz", {}, Hk * (2 * dk + 2 * r * dv), H));
    PD_ASSIGN_OR_RETURN(Matrix ba, matrix(a + "in_proj_ba", {}, Hk * 2 * r, H));
    const QkvzOrder o = qwen3_next_qkvz_order(static_cast<int>(Hk), static_cast<int>(Hv),
                                              static_cast<int>(dk), static_cast<int>(dv));
    auto* st = &out_->weights.storage;
    w->in_proj_qkv = gather_rows(qkvz, o.qkv, a + "in_proj_qkv", st);
    w->in_proj_z = gather_rows(qkvz, o.z, a + "in_proj_z", st);
    w->in_proj_b = gather_rows(ba, o.b, a + "in_proj_b", st);
    w->in_proj_a = gather_rows(ba, o.a, a + "in_proj_a", st);
    for (const char* n : {"in_proj_qkvz", "in_proj_ba"}) {
      for (const char* suffix : {".weight", "", ".scales", ".biases"}) {
        t_.append_format(a + n + suffix, ", re-ordered to q|k|v, z, b, a");
      }
    }
  } else {
    PD_ASSIGN_OR_RETURN(w->in_proj_qkv, matrix(a + "in_proj_qkv", {}, c_.conv_dim(), H));
    PD_ASSIGN_OR_RETURN(w->in_proj_z, matrix(a + "in_proj_z", {}, c_.value_dim(), H));
    PD_ASSIGN_OR_RETURN(w->in_proj_b, matrix(a + "in_proj_b", {}, Hv, H));
    PD_ASSIGN_OR_RETURN(w->in_proj_a, matrix(a + "in_proj_a", {}, Hv, H));
  }
  PD_ASSIGN_OR_RETURN(w->conv1d, conv(a + "conv1d.weight", c_.conv_dim(), c_.linear_conv_kernel_dim));
  PD_ASSIGN_OR_RETURN(w->dt_bias, vec(a + "dt_bias", Hv, false, false));
  PD_ASSIGN_OR_RETURN(w->A_log, vec(a + "A_log", Hv, false, false));
  PD_ASSIGN_OR_RETURN(w->norm, vec(a + "norm.weight", dv, false, false));
  PD_ASSIGN_OR_RETURN(w->out_proj, matrix(a + "out_proj", {}, H, c_.value_dim()));
  return Status::ok();
}

Status Binder::bind_experts(const std::string& p, MoeWeights* w, std::string* layout) {
  const int64_t E = c_.num_experts, I = c_.moe_intermediate_size, H = c_.hidden_size;
  w->gate_proj.resize(static_cast<size_t>(E));
  w->up_proj.resize(static_cast<size_t>(E));
  w->down_proj.resize(static_cast<size_t>(E));
  auto name_views = [&](const char* kind) {
    for (int64_t e = 0; e < E; ++e) {
      const std::string base = fmt::format("{}mlp.experts.{}.", p, e);
      w->gate_proj[e].name = base + "gate_proj";
      w->up_proj[e].name = base + "up_proj";
      w->down_proj[e].name = base + "down_proj";
    }
    *layout = kind;
  };
  const std::string fused = p + "mlp.experts.gate_up_proj";
  if (has(fused) || has(fused + ".weight")) {
    PD_ASSIGN_OR_RETURN(Matrix gu, matrix(fused, {E}, 2 * I, H));  // [E * 2I, H], gate rows first
    PD_ASSIGN_OR_RETURN(Matrix down, matrix(p + "mlp.experts.down_proj", {E}, H, I));
    for (int64_t e = 0; e < E; ++e) {
      w->gate_proj[e] = gu.row_slice(e * 2 * I, I);
      w->up_proj[e] = gu.row_slice(e * 2 * I + I, I);
      w->down_proj[e] = down.row_slice(e * H, H);
    }
    name_views("fused");
    return Status::ok();
  }
  const std::string sw = p + "mlp.switch_mlp.";
  if (has(sw + "gate_proj.weight")) {
    PD_ASSIGN_OR_RETURN(Matrix g, matrix(sw + "gate_proj", {E}, I, H));
    PD_ASSIGN_OR_RETURN(Matrix u, matrix(sw + "up_proj", {E}, I, H));
    PD_ASSIGN_OR_RETURN(Matrix d, matrix(sw + "down_proj", {E}, H, I));
    for (int64_t e = 0; e < E; ++e) {
      w->gate_proj[e] = g.row_slice(e * I, I);
      w->up_proj[e] = u.row_slice(e * I, I);
      w->down_proj[e] = d.row_slice(e * H, H);
    }
    name_views("switch_mlp");
    return Status::ok();
  }
  if (has(p + "mlp.experts.0.gate_proj.weight")) {
    for (int64_t e = 0; e < E; ++e) {
      const std::string base = fmt::format("{}mlp.experts.{}.", p, e);
      PD_ASSIGN_OR_RETURN(w->gate_proj[e], matrix(base + "gate_proj", {}, I, H));
      PD_ASSIGN_OR_RETURN(w->up_proj[e], matrix(base + "up_proj", {}, I, H));
      PD_ASSIGN_OR_RETURN(w->down_proj[e], matrix(base + "down_proj", {}, H, I));
    }
    *layout = "per-expert";
    return Status::ok();
  }
  return make_error(
      ErrorCode::kNotFound,
      "{}: no routed experts for '{}mlp' (looked for '{}', '{}' and '{}'); expected {} experts of "
      "[{}, {}]",
      out_->dir, display(p), display(fused), display(sw + "gate_proj.weight"),
      display(p + "mlp.experts.0.gate_proj.weight"), E, I, H);
}

Status Binder::bind_moe(const std::string& p, MoeWeights* w) {
  const int64_t H = c_.hidden_size, Is = c_.shared_expert_intermediate_size;
  PD_ASSIGN_OR_RETURN(w->gate, matrix(p + "mlp.gate", {}, c_.num_experts, H));
  std::string layout;
  PD_TRY(bind_experts(p, w, &layout));
  if (out_->expert_layout.empty() && p.starts_with("model.")) out_->expert_layout = layout;
  PD_ASSIGN_OR_RETURN(w->shared_gate_proj, matrix(p + "mlp.shared_expert.gate_proj", {}, Is, H));
  PD_ASSIGN_OR_RETURN(w->shared_up_proj, matrix(p + "mlp.shared_expert.up_proj", {}, Is, H));
  PD_ASSIGN_OR_RETURN(w->shared_down_proj, matrix(p + "mlp.shared_expert.down_proj", {}, H, Is));
  PD_ASSIGN_OR_RETURN(w->shared_expert_gate, matrix(p + "mlp.shared_expert_gate", {}, 1, H));
  return Status::ok();
}

Status Binder::bind_layer(const std::string& p, LayerType type, bool shifted, LayerWeights* w) {
  w->type = type;
  PD_ASSIGN_OR_RETURN(w->input_layernorm, vec(p + "input_layernorm.weight", c_.hidden_size, true, shifted));
  PD_ASSIGN_OR_RETURN(w->post_attention_layernorm,
                      vec(p + "post_attention_layernorm.weight", c_.hidden_size, true, shifted));
  if (type == LayerType::kFullAttention) {
    PD_TRY(bind_attention(p, shifted, &w->attn));
  } else {
    PD_TRY(bind_gdn(p, &w->gdn));
  }
  return bind_moe(p, &w->moe);
}

Status Binder::bind_mtp() {
  bool present = false;
  int found_layers = 0;
  for (const std::string& name : t_.names()) {
    if (!name.starts_with("mtp.")) continue;
    present = true;
    int j = -1;
    if (std::sscanf(name.c_str(), "mtp.layers.%d.", &j) == 1) found_layers = std::max(found_layers, j + 1);
  }
  int n = c_.mtp_layers_explicit ? c_.mtp_num_hidden_layers : (present ? std::max(found_layers, 1) : 0);
  if (!opt_.load_mtp) {
    skip_mtp_ = true;
    n = 0;
  } else if (n > 0 && !present) {
    out_->notices.push_back(
        fmt::format("config.json declares {} MTP layer(s) but the checkpoint has no mtp.* tensors: "
                    "speculative decoding is off",
                    n));
    n = 0;
  }
  out_->config.mtp_num_hidden_layers = n;
  if (n == 0) return Status::ok();
  const int64_t H = c_.hidden_size;
  MtpWeights m;
  PD_ASSIGN_OR_RETURN(m.fc, matrix("mtp.fc", {}, H, 2 * H));
  PD_ASSIGN_OR_RETURN(m.pre_fc_norm_embedding,
                      vec("mtp.pre_fc_norm_embedding.weight", H, true, mtp_shifted_));
  PD_ASSIGN_OR_RETURN(m.pre_fc_norm_hidden, vec("mtp.pre_fc_norm_hidden.weight", H, true, mtp_shifted_));
  PD_ASSIGN_OR_RETURN(m.norm, vec("mtp.norm.weight", H, true, mtp_shifted_));
  m.layers.resize(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) {
    PD_TRY(
        bind_layer(fmt::format("mtp.layers.{}.", j), LayerType::kFullAttention, mtp_shifted_, &m.layers[j]));
  }
  out_->weights.mtp = std::move(m);
  return Status::ok();
}

void Binder::finish_listing() {
  out_->tensors = t_.listing(
      [&](const std::string& cname) -> const char* {
        return skip_mtp_ && cname.starts_with("mtp.") ? "ignored (MTP not loaded)" : nullptr;
      },
      &out_->unused);
}

Status Binder::run() {
  out_->config = c_;
  for (const auto& f : store_.files()) out_->weights.storage.push_back(f.mapping());
  PD_TRY(t_.index());
  detect_layouts();
  const int64_t H = c_.hidden_size, V = c_.vocab_size;
  ModelWeights& w = out_->weights;
  PD_ASSIGN_OR_RETURN(w.embed_tokens, matrix("model.embed_tokens", {}, V, H));
  w.layers.resize(static_cast<size_t>(c_.num_hidden_layers));
  for (int i = 0; i < c_.num_hidden_layers; ++i) {
    PD_TRY(bind_layer(fmt::format("model.layers.{}.", i), c_.layer_types[i], main_shifted_, &w.layers[i]));
  }
  PD_ASSIGN_OR_RETURN(w.norm, vec("model.norm.weight", H, true, main_shifted_));
  if (c_.tie_word_embeddings) {
    w.lm_head = w.embed_tokens;
  } else {
    if (!has("lm_head.weight")) {
      return make_error(ErrorCode::kNotFound,
                        "{}: missing tensor '{}' (expected shape [{}, {}]) and tie_word_embeddings is false",
                        out_->dir, display("lm_head.weight"), V, H);
    }
    PD_ASSIGN_OR_RETURN(w.lm_head, matrix("lm_head", {}, V, H));
  }
  PD_TRY(bind_mtp());
  finish_listing();

  if (t_.vision_count() > 0) {
    out_->notices.push_back(fmt::format("skipped {} vision-tower tensors: PureDrive runs the text model only",
                                        t_.vision_count()));
  }
  for (const auto& n : out_->notices) PD_LOG_INFO("{}", n);
  if (!out_->unused.empty()) {
    const size_t shown = std::min<size_t>(out_->unused.size(), 12);
    const std::string list =
        fmt::format("{}{}", fmt::join(out_->unused.begin(), out_->unused.begin() + shown, ", "),
                    out_->unused.size() > shown ? ", ..." : "");
    if (opt_.error_on_unused) {
      return make_error(ErrorCode::kInvalidArgument, "{}: {} tensors are not used by the model: {}",
                        out_->dir, out_->unused.size(), list);
    }
    PD_LOG_WARN("{}: {} tensors are not used by the model: {}", out_->dir, out_->unused.size(), list);
  }
  return Status::ok();
}

}  // namespace

Expected<Checkpoint> bind_checkpoint(const ModelConfig& config, TensorStore store,
                                     const LoadOptions& options) {
  Checkpoint cp;
  if (cp.dir.empty() && !store.files().empty()) {
    cp.dir = std::filesystem::path(store.files().front().path()).parent_path().string();
  }
  Binder b(config, store, options, &cp);
  PD_TRY(b.run());
  return cp;
}

Expected<Checkpoint> load_checkpoint(const std::string& dir, const LoadOptions& options) {
  PD_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(dir));
  PD_ASSIGN_OR_RETURN(TensorStore store, TensorStore::open_dir(dir));
  PD_ASSIGN_OR_RETURN(Checkpoint cp, bind_checkpoint(config, std::move(store), options));
  cp.dir = dir;
  return cp;
}

}  // namespace pd
