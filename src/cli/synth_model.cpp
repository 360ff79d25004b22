#include "cli/synth_model.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "puredrive/backend/cuda/synth_rng.h"
#include "puredrive/backend/cuda/synth_source.h"
#include "puredrive/model/quantize.h"
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
  VisionShape vision;
};

// docs/spec/qwen3_5_moe.md §1.2 (the vision tower: the published checkpoint's inventory); "tiny" matches the
// golden fixtures' sizes, "tiny-wide-vocab" is "tiny" with Qwen3's padded vocabulary, so that the Qwen
// tokenizer of tests/data fits it.
Expected<ArchShape> arch_shape(const std::string& arch) {
  const VisionShape tiny_vision{1, 32, 64, 2, 4, 2, 2, 16};
  if (arch == "qwen3.5-35b-a3b") {
    return ArchShape{2048,
                     40,
                     248320,
                     16,
                     2,
                     256,
                     0.25,
                     1e7,
                     16,
                     32,
                     128,
                     128,
                     256,
                     8,
                     512,
                     512,
                     1,
                     64,
                     VisionShape{27, 1152, 4304, 16, 16, 2, 2, 2304}};
  }
  if (arch == "tiny") {
    return ArchShape{64, 4, 256, 4, 2, 32, 0.5, 1e4, 2, 4, 16, 16, 8, 2, 32, 32, 1, 32, tiny_vision};
  }
  if (arch == "tiny-wide-vocab") {
    return ArchShape{64, 4, 151936, 4, 2, 32, 0.5, 1e4, 2, 4, 16, 16, 8, 2, 32, 32, 1, 32, tiny_vision};
  }
  return make_error(ErrorCode::kInvalidArgument,
                    "unknown synthetic architecture '{}'; known: qwen3.5-35b-a3b, tiny, tiny-wide-vocab",
                    arch);
}

nlohmann::json text_config(const ArchShape& s) {
  nlohmann::json layer_types = nlohmann::json::array();
  for (int l = 0; l < s.layers; ++l)
    layer_types.push_back((l + 1) % 4 == 0 ? "full_attention" : "linear_attention");
  return {
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
}

// The published file's layout (tests/fixtures/configs/qwen3.5-35b-a3b): the text fields under text_config,
// the vision tower's next to it, the vision token ids at the top.
nlohmann::json published_config(const ArchShape& s) {
  nlohmann::json text = text_config(s);
  text["dtype"] = "bfloat16";
  text["attention_bias"] = false;
  text["hidden_act"] = "silu";
  text["mamba_ssm_dtype"] = "float32";
  text["mtp_use_dedicated_embeddings"] = false;
  text["router_aux_loss_coef"] = 0.001;
  // The published [11, 11, 10] split of the 32 rotary frequency pairs, scaled to the architecture's count.
  const int pairs = static_cast<int>(s.head_dim * s.rotary_factor) / 2;
  const int hw = (pairs * 11 + 16) / 32;
  text["rope_parameters"]["mrope_interleaved"] = true;
  text["rope_parameters"]["mrope_section"] = {hw, hw, pairs - 2 * hw};
  const VisionShape& v = s.vision;
  return {{"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
          {"model_type", "qwen3_5_moe"},
          {"dtype", "bfloat16"},
          {"text_config", text},
          {"vision_config",
           {{"model_type", "qwen3_5_moe"},
            {"depth", v.depth},
            {"hidden_size", v.hidden},
            {"intermediate_size", v.intermediate},
            {"num_heads", v.heads},
            {"in_channels", 3},
            {"patch_size", v.patch},
            {"temporal_patch_size", v.temporal_patch},
            {"spatial_merge_size", v.merge},
            {"num_position_embeddings", v.positions},
            {"out_hidden_size", s.hidden},
            {"hidden_act", "gelu_pytorch_tanh"},
            {"deepstack_visual_indexes", nlohmann::json::array()},
            {"initializer_range", 0.02}}},
          {"image_token_id", 248056},
          {"video_token_id", 248057},
          {"vision_start_token_id", 248053},
          {"vision_end_token_id", 248054},
          {"tie_word_embeddings", false}};
}

class Builder {
 public:
  Builder(SynthModel& m, bool materialize) : m_(m), materialize_(materialize) {}

  // A [rows, cols] matrix with values in [-amplitude, amplitude], in bf16 or as the model's recipe quantizes
  // it (`puredrive quantize`'s rules: routers 8-bit, widths the group does not divide stay bf16).
  Matrix matrix(const std::string& name, int64_t rows, int64_t cols, float amplitude) {
    Matrix x;
    x.name = name;
    x.rows = rows;
    x.cols = cols;
    std::optional<QuantParams> q;
    if (m_.recipe) q = module_quant_params(*m_.recipe, m_.group_size, classify_module(name), cols);
    const int bits = q ? q->bits : 0;
    if (bits == 0) {
      x.format = WeightFormat::kBF16;
    } else {
      x.format = WeightFormat::kAffine;
      x.bits = bits;
      x.group_size = q->group_size;
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
    const int64_t groups = rows * (cols / x.group_size);
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

  // Host vectors from the same generator: uniform in [lo, hi), rounded to the dtype a checkpoint stores them
  // in (bf16 or f32), so that a written checkpoint loads to the same values.
  std::vector<float> vector(const std::string& name, int64_t n, float lo, float hi, DType stored) {
    const uint64_t seed = synth::tensor_seed(m_.seed, name.c_str());
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const float u = 0.5f * (synth::uniform(seed, static_cast<uint64_t>(i)) + 1.0f);
      const float x = lo + (hi - lo) * u;
      v[static_cast<size_t>(i)] = stored == DType::kBF16 ? bf16_to_f32(f32_to_bf16(x)) : x;
    }
    return v;
  }

 private:
  SynthModel& m_;
  bool materialize_;
};

// Uniform in [-a, a] has variance a^2 / 3: a = sqrt(3 / fan_in) keeps unit-variance activations at unit
// variance through a product, so 40 layers stay finite.
float fan_in(int64_t k) {
  return std::sqrt(3.0f / static_cast<float>(k));
}

}  // namespace

const std::vector<std::string>& synth_archs() {
  static const std::vector<std::string> v = {"qwen3.5-35b-a3b", "tiny", "tiny-wide-vocab"};
  return v;
}
const std::vector<std::string>& synth_quants() {
  static const std::vector<std::string> v = {"bf16", "q8", "q6", "q4", "oq6e"};
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
                                                       uint64_t seed, bool materialize, int layers) {
  PD_ASSIGN_OR_RETURN(ArchShape s, arch_shape(arch));
  if (layers < 0 || layers > s.layers) {
    return make_error(ErrorCode::kInvalidArgument, "--layers {}: {} has 1 to {} layers", layers, arch,
                      s.layers);
  }
  if (layers > 0) s.layers = layers;
  auto m = std::make_unique<SynthModel>();
  if (quant != "bf16") {
    auto recipe = parse_quant_recipe(quant);
    if (!recipe) {
      return make_error(ErrorCode::kInvalidArgument, "unknown --quant '{}'; known: bf16, q8, q6, q4, oq6e",
                        quant);
    }
    m->recipe = *recipe;
    m->group_size = *recipe == QuantRecipe::kOq6e ? 64 : s.group;
  }
  m->arch = arch;
  m->quant = quant;
  m->seed = seed;
  m->vision = s.vision;
  m->published_config = published_config(s).dump();
  m->sources = std::make_shared<SynthSourceHolder>();
  PD_ASSIGN_OR_RETURN(m->config, parse_model_config(text_config(s).dump(), "synthetic " + arch));
  const ModelConfig& c = m->config;
  Builder b(*m, materialize);
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const int64_t q = int64_t{c.num_attention_heads} * c.head_dim,
                kv = int64_t{c.num_key_value_heads} * c.head_dim;
  const std::vector<float> ones(static_cast<size_t>(H), 1.0f);

  auto moe = [&](const std::string& p, StepBytes* bytes) {
    MoeWeights w;
    w.gate = b.matrix(p + "mlp.gate", c.num_experts, H, fan_in(H));
    w.shared_expert_gate = b.matrix(p + "mlp.shared_expert_gate", 1, H, fan_in(H));
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
      // Stored as the published checkpoint stores them: conv taps and dt_bias bf16, A_log f32.
      g.conv1d = b.vector(p + "linear_attn.conv1d", int64_t{c.conv_dim()} * c.linear_conv_kernel_dim, -0.5f,
                          0.5f, DType::kBF16);
      g.A_log = b.vector(p + "linear_attn.A_log", hv, 0.0f, std::log(16.0f), DType::kF32);
      g.dt_bias = b.vector(p + "linear_attn.dt_bias", hv, -1.0f, 1.0f, DType::kBF16);
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
  sb.lm_head = m->weights.lm_head.nbytes();
  sb.dense += sb.lm_head;
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
    // The head's step bytes, counted like a decoder layer's, then moved to the mtp_ fields.
    StepBytes head;
    lw.attn = attention("mtp.layers.0.", &head);
    lw.moe = moe("mtp.layers.0.", &head);
    sb.mtp_dense = head.dense + mtp.fc.nbytes() + m->weights.embed_tokens.nbytes() / V;
    sb.mtp_experts_active = head.experts_active;
    sb.mtp_kv_per_token = head.kv_per_token;
    mtp.layers.push_back(std::move(lw));
    m->weights.mtp = std::move(mtp);
  }
  return m;
}

}  // namespace pd::cli
