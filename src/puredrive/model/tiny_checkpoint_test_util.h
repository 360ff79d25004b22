// Test-only: writes tiny synthetic checkpoints (config.json + safetensors) in every layout the loader
// accepts, and remembers what it stored so tests can check the bound weights against the stored values.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "puredrive/checkpoint/affine.h"
#include "puredrive/checkpoint/safetensors.h"
#include "puredrive/checkpoint/safetensors_writer.h"
#include "puredrive/checkpoint/temp_dir_test_util.h"
#include "puredrive/util/status.h"

namespace pd::testing_util {

enum class Experts { kFused, kPerExpert, kSwitchMlp };

struct TinySpec {
  std::string model_type = "qwen3_5_moe";             // qwen3_5_moe (nested), qwen3_5_moe_text, qwen3_next
  std::string main_prefix = "model.language_model.";  // stored prefix of embed/layers/norm
  std::string head_name = "lm_head.weight";
  std::string mtp_prefix = "mtp.";  // empty: no MTP tensors
  bool mtp_in_config = true;        // write mtp_num_hidden_layers: 1
  Experts experts = Experts::kFused;
  Experts mtp_experts = Experts::kPerExpert;
  bool fused_qkvz = false;    // Qwen3-Next in_proj_qkvz / in_proj_ba
  bool mlx_layout = false;    // conv1d [C, K, 1] and norms stored as 1 + w
  DType dtype = DType::kF32;  // float tensors
  int quant_bits = 0;         // 0: float checkpoint; else MLX affine with these global bits
  int group_size = 32;
  std::map<std::string, int> bits_by_suffix;  // module-path suffix -> bits override (0 = keep float)
  bool vision = false;
  int shards = 1;
  bool tie = false;
  int layers = 4;  // full attention every 2nd layer
};

// Small dims that still divide by every group size used in tests (32).
struct TinyDims {
  int64_t H = 64, V = 96, Hq = 4, Hkv = 2, D = 16, Hk = 2, Hv = 4, dk = 16, dv = 16, K = 4, E = 4, k = 2,
          I = 32, Is = 32;
  int64_t conv_dim() const { return 2 * Hk * dk + Hv * dv; }
  int64_t value_dim() const { return Hv * dv; }
};

struct StoredTensor {
  std::vector<int64_t> shape;     // logical (float) shape
  std::vector<float> values;      // as stored (rounded to the dtype), before quantization
  std::optional<AffineMatrix> q;  // set when stored quantized: rows = product(shape[:-1])
  // Row r of the 2-D view [product(shape[:-1]), shape.back()] as the engine should see it.
  std::vector<float> row(int64_t r) const {
    const int64_t cols = shape.back();
    std::vector<float> out(static_cast<size_t>(cols));
    if (q) {
      q->view().dequantize_row(r, out.data());
    } else {
      std::copy(values.begin() + r * cols, values.begin() + (r + 1) * cols, out.begin());
    }
    return out;
  }
};

class TinyCheckpoint {
 public:
  TinyCheckpoint(TinySpec spec, std::string dir) : s_(std::move(spec)), dir_(std::move(dir)) {}

  // Writes config.json and the weights; returns the stored tensors by stored name.
  void write() {
    write_config();
    write_tensors();
  }
  const std::map<std::string, StoredTensor>& stored() const { return stored_; }
  const StoredTensor& at(const std::string& name) const {
    auto it = stored_.find(name);
    PD_ASSERT(it != stored_.end(), "test bug: no stored tensor {}", name);
    return it->second;
  }
  const TinyDims& dims() const { return d_; }
  const TinySpec& spec() const { return s_; }
  bool is_full(int layer) const { return layer % 2 == 1; }
  nlohmann::json& config() { return config_; }

 private:
  // Deterministic values in [-0.5, 0.5) from the name, so every tensor differs.
  std::vector<float> values_for(const std::string& name, int64_t n) const {
    uint64_t h = 1469598103934665603ull;
    for (char ch : name) h = (h ^ static_cast<uint8_t>(ch)) * 1099511628211ull;
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) {
      h = h * 6364136223846793005ull + 1442695040888963407ull;
      float f = static_cast<float>((h >> 40) & 0xffffff) / 16777216.0f - 0.5f;
      if (s_.dtype == DType::kBF16) f = round_to_bf16(f);
      if (s_.dtype == DType::kF16) f = f16_to_f32(f32_to_f16(f));
      x = f;
    }
    return v;
  }

  std::optional<int> bits_for(const std::string& module) const {
    if (s_.quant_bits == 0) return std::nullopt;
    for (const auto& [suffix, b] : s_.bits_by_suffix) {
      if (module.size() >= suffix.size() &&
          module.compare(module.size() - suffix.size(), suffix.size(), suffix) == 0) {
        if (b == 0) return std::nullopt;
        return b;
      }
    }
    return s_.quant_bits;
  }

  void add_float(const std::string& name, std::vector<int64_t> shape, std::vector<float> v) {
    PD_ASSERT(w_.add_f32(name, s_.dtype, shape, v).is_ok(), "add {}", name);
    stored_[name] = StoredTensor{std::move(shape), std::move(v), std::nullopt};
  }

  // A linear module at stored path `module` with float shape [lead..., rows, cols]; `weight_suffix` is
  // ".weight" except for fused experts.
  void add_matrix(const std::string& module, std::vector<int64_t> shape,
                  const std::string& weight_suffix = ".weight") {
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
    const int64_t cols = shape.back();
    const std::string wname = module + weight_suffix;
    std::vector<float> v = values_for(wname, rows * cols);
    const auto bits = bits_for(module);
    if (!bits) {
      add_float(wname, shape, std::move(v));
      return;
    }
    auto q = quantize_affine(v.data(), rows, cols, *bits, s_.group_size, DType::kBF16);
    PD_ASSERT(q.has_value(), "{}", q.status().message());
    std::vector<int64_t> packed = shape, groups = shape;
    packed.back() = affine_packed_cols(cols, *bits);
    groups.back() = cols / s_.group_size;
    PD_ASSERT(w_.add(wname, DType::kU32, packed, q->codes.data(), q->codes.size() * 4).is_ok(), "");
    PD_ASSERT(w_.add(module + ".scales", DType::kBF16, groups, q->scales).is_ok(), "");
    PD_ASSERT(w_.add(module + ".biases", DType::kBF16, groups, q->biases).is_ok(), "");
    if (*bits != s_.quant_bits) overrides_[module] = *bits;
    stored_[wname] = StoredTensor{shape, std::move(v), std::move(q).value()};
  }

  void add_norm(const std::string& name, int64_t n, bool zero_centred) {
    std::vector<float> v = values_for(name, n);
    if (zero_centred && s_.mlx_layout) {
      for (auto& x : v) x = s_.dtype == DType::kBF16 ? round_to_bf16(1.0f + x) : 1.0f + x;
    }
    add_float(name, {n}, std::move(v));
  }

  void add_experts(const std::string& p, Experts layout) {
    const TinyDims& d = d_;
    switch (layout) {
      case Experts::kFused:
        add_matrix(p + "mlp.experts.gate_up_proj", {d.E, 2 * d.I, d.H}, "");
        add_matrix(p + "mlp.experts.down_proj", {d.E, d.H, d.I}, "");
        break;
      case Experts::kSwitchMlp:
        add_matrix(p + "mlp.switch_mlp.gate_proj", {d.E, d.I, d.H});
        add_matrix(p + "mlp.switch_mlp.up_proj", {d.E, d.I, d.H});
        add_matrix(p + "mlp.switch_mlp.down_proj", {d.E, d.H, d.I});
        break;
      case Experts::kPerExpert:
        for (int64_t e = 0; e < d.E; ++e) {
          const std::string b = p + "mlp.experts." + std::to_string(e) + ".";
          add_matrix(b + "gate_proj", {d.I, d.H});
          add_matrix(b + "up_proj", {d.I, d.H});
          add_matrix(b + "down_proj", {d.H, d.I});
        }
        break;
    }
  }

  void add_layer(const std::string& p, bool full, Experts experts) {
    const TinyDims& d = d_;
    add_norm(p + "input_layernorm.weight", d.H, true);
    add_norm(p + "post_attention_layernorm.weight", d.H, true);
    if (full) {
      add_matrix(p + "self_attn.q_proj", {d.Hq * d.D * 2, d.H});
      add_matrix(p + "self_attn.k_proj", {d.Hkv * d.D, d.H});
      add_matrix(p + "self_attn.v_proj", {d.Hkv * d.D, d.H});
      add_matrix(p + "self_attn.o_proj", {d.H, d.Hq * d.D});
      add_norm(p + "self_attn.q_norm.weight", d.D, true);
      add_norm(p + "self_attn.k_norm.weight", d.D, true);
    } else {
      const std::string a = p + "linear_attn.";
      if (s_.fused_qkvz) {
        add_matrix(a + "in_proj_qkvz", {d.conv_dim() + d.value_dim(), d.H});
        add_matrix(a + "in_proj_ba", {2 * d.Hv, d.H});
      } else {
        add_matrix(a + "in_proj_qkv", {d.conv_dim(), d.H});
        add_matrix(a + "in_proj_z", {d.value_dim(), d.H});
        add_matrix(a + "in_proj_b", {d.Hv, d.H});
        add_matrix(a + "in_proj_a", {d.Hv, d.H});
      }
      const std::vector<int64_t> conv_shape = s_.mlx_layout ? std::vector<int64_t>{d.conv_dim(), d.K, 1}
                                                            : std::vector<int64_t>{d.conv_dim(), 1, d.K};
      add_float(a + "conv1d.weight", conv_shape, values_for(a + "conv1d.weight", d.conv_dim() * d.K));
      add_norm(a + "dt_bias", d.Hv, false);
      add_norm(a + "A_log", d.Hv, false);
      add_norm(a + "norm.weight", d.dv, false);
      add_matrix(a + "out_proj", {d.H, d.value_dim()});
    }
    add_matrix(p + "mlp.gate", {d.E, d.H});
    add_experts(p, experts);
    add_matrix(p + "mlp.shared_expert.gate_proj", {d.Is, d.H});
    add_matrix(p + "mlp.shared_expert.up_proj", {d.Is, d.H});
    add_matrix(p + "mlp.shared_expert.down_proj", {d.H, d.Is});
    add_matrix(p + "mlp.shared_expert_gate", {1, d.H});
  }

  void write_tensors() {
    const TinyDims& d = d_;
    const std::string& m = s_.main_prefix;
    add_matrix(m + "embed_tokens", {d.V, d.H});
    for (int i = 0; i < s_.layers; ++i)
      add_layer(m + "layers." + std::to_string(i) + ".", is_full(i), s_.experts);
    add_norm(m + "norm.weight", d.H, true);
    if (!s_.tie) add_matrix(s_.head_name.substr(0, s_.head_name.size() - 7), {d.V, d.H});
    if (!s_.mtp_prefix.empty()) {
      add_matrix(s_.mtp_prefix + "fc", {d.H, 2 * d.H});
      add_norm(s_.mtp_prefix + "pre_fc_norm_embedding.weight", d.H, true);
      add_norm(s_.mtp_prefix + "pre_fc_norm_hidden.weight", d.H, true);
      add_norm(s_.mtp_prefix + "norm.weight", d.H, true);
      add_layer(s_.mtp_prefix + "layers.0.", true, s_.mtp_experts);
    }
    if (s_.vision) {
      const std::string v = s_.main_prefix == "language_model.model." ? "vision_tower." : "model.visual.";
      add_float(v + "patch_embed.proj.weight", {8, 4}, values_for("vision", 32));
      add_float(v + "blocks.0.norm1.weight", {8}, values_for("vision2", 8));
    }
    if (s_.quant_bits > 0) {
      nlohmann::json q = {{"bits", s_.quant_bits}, {"group_size", s_.group_size}, {"mode", "affine"}};
      for (const auto& [module, bits] : overrides_)
        q[module] = {{"bits", bits}, {"group_size", s_.group_size}};
      config_["quantization"] = q;
      config_["quantization_config"] = q;
      write_text(dir_ + "/config.json", config_.dump(2));
    }
    if (s_.shards <= 1) {
      PD_ASSERT(w_.write(dir_ + "/model.safetensors").is_ok(), "write");
      return;
    }
    // Round-robin the stored names over the shards, keeping quantized triplets together.
    std::vector<SafetensorsWriter> shards(static_cast<size_t>(s_.shards));
    nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
    std::string image = w_.serialize();
    auto file =
        SafetensorsFile::parse(reinterpret_cast<const uint8_t*>(image.data()), image.size(), "mem", nullptr);
    PD_ASSERT(file.has_value(), "{}", file.status().message());
    int i = 0;
    std::map<std::string, int> module_shard;
    for (const auto& t : file->tensors()) {
      std::string module = t.name;
      for (const char* suf : {".weight", ".scales", ".biases"}) {
        if (module.ends_with(suf)) module = module.substr(0, module.size() - std::string(suf).size());
      }
      auto [it, inserted] = module_shard.emplace(module, i % s_.shards);
      if (inserted) ++i;
      const int sh = it->second;
      PD_ASSERT(shards[sh].add(t.name, t.dtype, t.shape, t.data, t.nbytes).is_ok(), "");
      const std::string fname = fmt::format("model-{:05d}-of-{:05d}.safetensors", sh + 1, s_.shards);
      index["weight_map"][t.name] = fname;
    }
    for (int sh = 0; sh < s_.shards; ++sh) {
      const std::string fname = fmt::format("model-{:05d}-of-{:05d}.safetensors", sh + 1, s_.shards);
      PD_ASSERT(shards[sh].write(dir_ + "/" + fname).is_ok(), "");
    }
    write_text(dir_ + "/model.safetensors.index.json", index.dump(2));
  }

  void write_config() {
    const TinyDims& d = d_;
    nlohmann::json text = {
        {"hidden_size", d.H},
        {"num_hidden_layers", s_.layers},
        {"vocab_size", d.V},
        {"num_attention_heads", d.Hq},
        {"num_key_value_heads", d.Hkv},
        {"head_dim", d.D},
        {"linear_num_key_heads", d.Hk},
        {"linear_num_value_heads", d.Hv},
        {"linear_key_head_dim", d.dk},
        {"linear_value_head_dim", d.dv},
        {"linear_conv_kernel_dim", d.K},
        {"num_experts", d.E},
        {"num_experts_per_tok", d.k},
        {"moe_intermediate_size", d.I},
        {"shared_expert_intermediate_size", d.Is},
        {"rms_norm_eps", 1e-6},
        {"tie_word_embeddings", s_.tie},
        {"full_attention_interval", 2},
        {"hidden_act", "silu"},
    };
    if (s_.model_type == "qwen3_next") {
      text["rope_theta"] = 1e6;
      text["partial_rotary_factor"] = 0.25;
      if (s_.mtp_in_config) text["num_nextn_predict_layers"] = 1;
    } else {
      text["rope_parameters"] = {
          {"rope_type", "default"}, {"rope_theta", 1e7}, {"partial_rotary_factor", 0.25}};
      if (s_.mtp_in_config) text["mtp_num_hidden_layers"] = 1;
    }
    if (s_.model_type == "qwen3_5_moe") {
      text["model_type"] = "qwen3_5_moe_text";
      config_ = {{"model_type", "qwen3_5_moe"}, {"text_config", text}, {"tie_word_embeddings", s_.tie}};
      if (s_.vision) config_["vision_config"] = {{"depth", 1}};
    } else {
      config_ = text;
      config_["model_type"] = s_.model_type;
    }
    write_text(dir_ + "/config.json", config_.dump(2));
  }

  TinySpec s_;
  std::string dir_;
  TinyDims d_;
  SafetensorsWriter w_;
  nlohmann::json config_;
  std::map<std::string, StoredTensor> stored_;
  std::map<std::string, int> overrides_;
};

}  // namespace pd::testing_util
