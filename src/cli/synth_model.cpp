#include "cli/synth_model.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "puredrive/backend/cuda/synth_rng.h"
#include "puredrive/backend/cuda/synth_source.h"
#include "puredrive/util/dtype.h"

namespace pd::cli {

struct SynthSourceHolder {
  std::deque<synth::SynthSource> sources;
  ~SynthSourceHolder() {
    for (const synth::SynthSource& s : sources) synth::unregister_source(&s);
  }
};

namespace {

struct ArchShape {
  int hidden, layers, vocab, heads, kv_heads, head_dim;
  double rotary_factor, rope_theta;
  int k_heads, v_heads, k_dim, v_dim, experts, top_k, inter, shared_inter, mtp_layers, group;
};

// docs/spec/qwen3_5_moe.md §1.2; "tiny" matches the golden fixtures' sizes.
Expected<ArchShape> arch_shape(const std::string& arch) {
  if (arch == "qwen3.5-35b-a3b") {
    return ArchShape{2048, 40, 248320, 16, 2, 256, 0.25, 1e7, 16, 32, 128, 128, 256, 8, 512, 512, 1, 64};
  }
  if (arch == "tiny") return ArchShape{64, 4, 256, 4, 2, 32, 0.5, 1e4, 2, 4, 16, 16, 8, 2, 32, 32, 1, 32};
  return make_error(ErrorCode::kInvalidArgument,
                    "unknown synthetic architecture '{}'; known: qwen3.5-35b-a3b, tiny", arch);
}

std::string config_json(const ArchShape& s) {
  nlohmann::json layer_types = nlohmann::json::array();
  for (int l = 0; l < s.layers; ++l)
    layer_types.push_back((l + 1) % 4 == 0 ? "full_attention" : "linear_attention");
  const nlohmann::json c = {
      {"model_type", "qwen3_5_moe_text"},
      {"hidden_size", s.hidden},
      {"num_hidden_layers", s.layers},
      {"vocab_size", s.vocab},
      {"num_attention_heads", s.heads},
      {"num_key_value_heads", s.kv_heads},
      {"head_dim", s.head_dim},
      {"attn_output_gate", true},
      {"rope_parameters",
       {{"rope_theta", s.rope_theta}, {"partial_rotary_factor", s.rotary_factor}, {"rope_type", "default"}}},
      {"partial_rotary_factor", s.rotary_factor},
      {"rms_norm_eps", 1e-6},
      {"linear_num_key_heads", s.k_heads},
      {"linear_num_value_heads", s.v_heads},
      {"linear_key_head_dim", s.k_dim},
      {"linear_value_head_dim", s.v_dim},
      {"linear_conv_kernel_dim", 4},
      {"num_experts", s.experts},
      {"num_experts_per_tok", s.top_k},
      {"moe_intermediate_size", s.inter},
      {"shared_expert_intermediate_size", s.shared_inter},
      {"mtp_num_hidden_layers", s.mtp_layers},
      {"tie_word_embeddings", false},
      {"max_position_embeddings", 262144},
      {"layer_types", layer_types},
      {"full_attention_interval", 4}};
  return c.dump();
}

class Builder {
 public:
  Builder(SynthModel& m, const std::string& quant, int group, bool materialize)
      : m_(m), quant_(quant), group_(group), materialize_(materialize) {}

  // A [rows, cols] matrix with values in [-amplitude, amplitude]; routers keep 8 bits under q6/q4.
  Matrix matrix(const std::string& name, int64_t rows, int64_t cols, float amplitude, bool router = false) {
    Matrix x;
    x.name = name;
    x.rows = rows;
    x.cols = cols;
    int bits = 0;
    if (quant_ == "q8") bits = 8;
    if (quant_ == "q6") bits = router ? 8 : 6;
    if (quant_ == "q4") bits = router ? 8 : 4;
    if (bits == 0) {
      x.format = WeightFormat::kBF16;
    } else {
      x.format = WeightFormat::kAffine;
      x.bits = bits;
      x.group_size = group_;
      x.scale_dtype = DType::kBF16;
    }
    const uint64_t seed = synth::tensor_seed(m_.seed, name.c_str());
    m_.weight_bytes += x.nbytes();
    if (!materialize_) {
      m_.sources->sources.push_back({.seed = seed, .amplitude = amplitude});
      const synth::SynthSource* src = &m_.sources->sources.back();
      synth::register_source(src);
      x.data = src;
      if (bits != 0) {
        x.scales = src;
        x.biases = src;
      }
      return x;
    }
    if (bits == 0) {
      std::vector<uint8_t>& d = m_.host.emplace_back(static_cast<size_t>(rows * cols * 2));
      auto* p = reinterpret_cast<uint16_t*>(d.data());
      for (int64_t i = 0; i < rows * cols; ++i) {
        p[i] = f32_to_bf16(synth::dense_value(seed, amplitude, static_cast<uint64_t>(i)));
      }
      x.data = d.data();
      return x;
    }
    const int64_t words = rows * cols * bits / 32;
    std::vector<uint8_t>& d = m_.host.emplace_back(static_cast<size_t>(words * 4));
    auto* w = reinterpret_cast<uint32_t*>(d.data());
    for (int64_t i = 0; i < words; ++i) w[i] = synth::affine_word(seed, static_cast<uint64_t>(i));
    const int64_t groups = rows * (cols / group_);
    std::vector<uint8_t>& sc = m_.host.emplace_back(static_cast<size_t>(groups * 2));
    std::vector<uint8_t>& bi = m_.host.emplace_back(static_cast<size_t>(groups * 2));
    const uint16_t s = f32_to_bf16(synth::affine_scale(amplitude, bits));
    const uint16_t b = f32_to_bf16(synth::affine_bias(amplitude));
    for (int64_t g = 0; g < groups; ++g) {
      std::memcpy(sc.data() + g * 2, &s, 2);
      std::memcpy(bi.data() + g * 2, &b, 2);
    }
    x.data = d.data();
    x.scales = sc.data();
    x.biases = bi.data();
    return x;
  }

  // Host vectors from the same generator: uniform in [lo, hi).
  std::vector<float> vector(const std::string& name, int64_t n, float lo, float hi) {
    const uint64_t seed = synth::tensor_seed(m_.seed, name.c_str());
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const float u = 0.5f * (synth::uniform(seed, static_cast<uint64_t>(i)) + 1.0f);
      v[static_cast<size_t>(i)] = lo + (hi - lo) * u;
    }
    return v;
  }

 private:
  SynthModel& m_;
  std::string quant_;
  int group_;
  bool materialize_;
};

// Uniform in [-a, a] has variance a^2 / 3: a = sqrt(3 / fan_in) keeps unit-variance activations at unit
// variance through a product, so 40 layers stay finite.
float fan_in(int64_t k) {
  return std::sqrt(3.0f / static_cast<float>(k));
}

}  // namespace

const std::vector<std::string>& synth_archs() {
  static const std::vector<std::string> v = {"qwen3.5-35b-a3b", "tiny"};
  return v;
}
const std::vector<std::string>& synth_quants() {
  static const std::vector<std::string> v = {"bf16", "q8", "q6", "q4"};
  return v;
}

std::vector<int32_t> synth_tokens(uint64_t seed, int vocab, int count) {
  std::vector<int32_t> t(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    t[static_cast<size_t>(i)] = static_cast<int32_t>(
        synth::hash32(seed ^ 0x746f6b656e73ull, static_cast<uint64_t>(i)) % static_cast<uint32_t>(vocab));
  }
  return t;
}

Expected<std::unique_ptr<SynthModel>> make_synth_model(const std::string& arch, const std::string& quant,
                                                       uint64_t seed, bool materialize) {
  PD_ASSIGN_OR_RETURN(ArchShape s, arch_shape(arch));
  if (quant != "bf16" && quant != "q8" && quant != "q6" && quant != "q4") {
    return make_error(ErrorCode::kInvalidArgument, "unknown --quant '{}'; known: bf16, q8, q6, q4", quant);
  }
  auto m = std::make_unique<SynthModel>();
  m->arch = arch;
  m->quant = quant;
  m->seed = seed;
  m->sources = std::make_shared<SynthSourceHolder>();
  PD_ASSIGN_OR_RETURN(m->config, parse_model_config(config_json(s), "synthetic " + arch));
  const ModelConfig& c = m->config;
  Builder b(*m, quant, s.group, materialize);
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const int64_t q = int64_t{c.num_attention_heads} * c.head_dim,
                kv = int64_t{c.num_key_value_heads} * c.head_dim;
  const std::vector<float> ones(static_cast<size_t>(H), 1.0f);

  auto moe = [&](const std::string& p, StepBytes* bytes) {
    MoeWeights w;
    w.gate = b.matrix(p + "mlp.gate", c.num_experts, H, fan_in(H), true);
    w.shared_expert_gate = b.matrix(p + "mlp.shared_expert_gate", 1, H, fan_in(H), true);
    w.shared_gate_proj =
        b.matrix(p + "mlp.shared_expert.gate_proj", c.shared_expert_intermediate_size, H, fan_in(H));
    w.shared_up_proj =
        b.matrix(p + "mlp.shared_expert.up_proj", c.shared_expert_intermediate_size, H, fan_in(H));
    w.shared_down_proj = b.matrix(p + "mlp.shared_expert.down_proj", H, c.shared_expert_intermediate_size,
                                  fan_in(c.shared_expert_intermediate_size));
    for (int e = 0; e < c.num_experts; ++e) {
      const std::string ep = fmt::format("{}mlp.experts.{}.", p, e);
      w.gate_proj.push_back(b.matrix(ep + "gate_proj", c.moe_intermediate_size, H, fan_in(H)));
      w.up_proj.push_back(b.matrix(ep + "up_proj", c.moe_intermediate_size, H, fan_in(H)));
      w.down_proj.push_back(
          b.matrix(ep + "down_proj", H, c.moe_intermediate_size, fan_in(c.moe_intermediate_size)));
    }
    if (bytes != nullptr) {
      bytes->dense += w.gate.nbytes() + w.shared_expert_gate.nbytes() + w.shared_gate_proj.nbytes() +
                      w.shared_up_proj.nbytes() + w.shared_down_proj.nbytes();
      bytes->experts_active +=
          c.num_experts_per_tok * (w.gate_proj[0].nbytes() + w.up_proj[0].nbytes() + w.down_proj[0].nbytes());
    }
    return w;
  };
  auto attention = [&](const std::string& p, StepBytes* bytes) {
    AttentionWeights a;
    a.q_proj = b.matrix(p + "self_attn.q_proj", 2 * q, H, fan_in(H));
    a.k_proj = b.matrix(p + "self_attn.k_proj", kv, H, fan_in(H));
    a.v_proj = b.matrix(p + "self_attn.v_proj", kv, H, fan_in(H));
    a.o_proj = b.matrix(p + "self_attn.o_proj", H, q, fan_in(q));
    a.q_norm.assign(static_cast<size_t>(c.head_dim), 1.0f);
    a.k_norm.assign(static_cast<size_t>(c.head_dim), 1.0f);
    if (bytes != nullptr) {
      bytes->dense += a.q_proj.nbytes() + a.k_proj.nbytes() + a.v_proj.nbytes() + a.o_proj.nbytes();
      bytes->kv_per_token += 2 * kv * 2;  // bf16 K and V
    }
    return a;
  };

  StepBytes& sb = m->step_bytes;
  m->weights.embed_tokens = b.matrix("model.embed_tokens", V, H, 1.0f);
  sb.dense += m->weights.embed_tokens.nbytes() / V;  // one row per token
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    LayerWeights lw;
    lw.type = c.layer_types[static_cast<size_t>(l)];
    lw.input_layernorm = ones;
    lw.post_attention_layernorm = ones;
    if (lw.type == LayerType::kFullAttention) {
      lw.attn = attention(p, &sb);
    } else {
      GdnWeights& g = lw.gdn;
      const int64_t vd = c.value_dim(), hv = c.linear_num_value_heads;
      g.in_proj_qkv = b.matrix(p + "linear_attn.in_proj_qkv", c.conv_dim(), H, fan_in(H));
      g.in_proj_z = b.matrix(p + "linear_attn.in_proj_z", vd, H, fan_in(H));
      g.in_proj_b = b.matrix(p + "linear_attn.in_proj_b", hv, H, fan_in(H));
      g.in_proj_a = b.matrix(p + "linear_attn.in_proj_a", hv, H, fan_in(H));
      g.out_proj = b.matrix(p + "linear_attn.out_proj", H, vd, fan_in(vd));
      g.conv1d =
          b.vector(p + "linear_attn.conv1d", int64_t{c.conv_dim()} * c.linear_conv_kernel_dim, -0.5f, 0.5f);
      g.A_log = b.vector(p + "linear_attn.A_log", hv, 0.0f, std::log(16.0f));
      g.dt_bias = b.vector(p + "linear_attn.dt_bias", hv, -1.0f, 1.0f);
      g.norm.assign(static_cast<size_t>(c.linear_value_head_dim), 1.0f);
      sb.dense += g.in_proj_qkv.nbytes() + g.in_proj_z.nbytes() + g.in_proj_b.nbytes() +
                  g.in_proj_a.nbytes() + g.out_proj.nbytes();
      const int64_t state = hv * c.linear_key_head_dim * c.linear_value_head_dim +
                            int64_t{c.linear_conv_kernel_dim - 1} * c.conv_dim();
      sb.gdn_state += 2 * state * 4;  // f32, read and written
    }
    lw.moe = moe(p, &sb);
    m->weights.layers.push_back(std::move(lw));
  }
  m->weights.norm = ones;
  m->weights.lm_head = b.matrix("lm_head", V, H, fan_in(H));
  sb.dense += m->weights.lm_head.nbytes();
  if (c.mtp_num_hidden_layers > 0) {
    MtpWeights mtp;
    mtp.fc = b.matrix("mtp.fc", H, 2 * H, fan_in(2 * H));
    mtp.pre_fc_norm_embedding = ones;
    mtp.pre_fc_norm_hidden = ones;
    mtp.norm = ones;
    LayerWeights lw;
    lw.type = LayerType::kFullAttention;
    lw.input_layernorm = ones;
    lw.post_attention_layernorm = ones;
    lw.attn = attention("mtp.layers.0.", nullptr);
    lw.moe = moe("mtp.layers.0.", nullptr);
    mtp.layers.push_back(std::move(lw));
    m->weights.mtp = std::move(mtp);
  }
  return m;
}

}  // namespace pd::cli
