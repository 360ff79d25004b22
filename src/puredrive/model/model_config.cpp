// config.json -> ModelConfig. Layouts (docs/spec/qwen3_5_moe.md §1.1): qwen3_5_moe nests the text fields in
// text_config; qwen3_5_moe_text and qwen3_next are flat. RoPE parameters are either flat or in
// rope_parameters (transformers >= 5 writes the latter). Optional fields take the transformers config-class
// defaults; the structural sizes are required, because a silently defaulted size loads the wrong model.
#include "puredrive/model/model_config.h"

#include <cmath>
#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include "puredrive/util/mapped_file.h"

namespace pd {
namespace {

using json = nlohmann::json;

// Reads fields of one JSON object; `prefix` ("text_config.") makes error messages name the full path.
class FieldReader {
 public:
  FieldReader(const json& obj, std::string prefix, const std::string& source)
      : obj_(obj), prefix_(std::move(prefix)), source_(source) {}

  bool has(const char* key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }
  const json* get(const char* key) const { return has(key) ? &obj_.at(key) : nullptr; }
  std::string path(const char* key) const { return prefix_ + key; }

  Status missing(const char* key) const {
    return make_error(ErrorCode::kInvalidArgument, "{}: missing required field '{}'", source_, path(key));
  }
  Status bad(const char* key, const char* expected) const {
    return make_error(ErrorCode::kInvalidArgument, "{}: field '{}' must be {}, found {}", source_, path(key),
                      expected, obj_.at(key).dump());
  }

  Status int_field(const char* key, int* out, bool required, int min_value = 1) const {
    const json* v = get(key);
    if (v == nullptr) return required ? missing(key) : Status::ok();
    if (!v->is_number_integer()) return bad(key, "an integer");
    const int64_t i = v->get<int64_t>();
    if (i < min_value || i > std::numeric_limits<int>::max()) {
      return make_error(ErrorCode::kInvalidArgument, "{}: field '{}' = {} is out of range (expected >= {})",
                        source_, path(key), i, min_value);
    }
    *out = static_cast<int>(i);
    return Status::ok();
  }
  Status double_field(const char* key, double* out, bool required) const {
    const json* v = get(key);
    if (v == nullptr) return required ? missing(key) : Status::ok();
    if (!v->is_number()) return bad(key, "a number");
    *out = v->get<double>();
    return Status::ok();
  }
  Status bool_field(const char* key, bool* out) const {
    const json* v = get(key);
    if (v == nullptr) return Status::ok();
    if (!v->is_boolean()) return bad(key, "true or false");
    *out = v->get<bool>();
    return Status::ok();
  }
  Status string_field(const char* key, std::string* out) const {
    const json* v = get(key);
    if (v == nullptr) return Status::ok();
    if (!v->is_string()) return bad(key, "a string");
    *out = v->get<std::string>();
    return Status::ok();
  }

  const std::string& source() const { return source_; }
  const std::string& prefix() const { return prefix_; }

 private:
  const json& obj_;
  std::string prefix_;
  const std::string& source_;
};

bool valid_bits(int b) {
  return b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8;
}
bool valid_group(int g) {
  return g == 32 || g == 64 || g == 128;
}

Status check_quant_params(const QuantParams& q, const std::string& where, const std::string& src) {
  if (!valid_bits(q.bits)) {
    return make_error(ErrorCode::kUnsupported,
                      "{}: {}: bits = {} is not supported (expected 2, 3, 4, 5, 6 or 8)", src, where, q.bits);
  }
  if (!valid_group(q.group_size)) {
    return make_error(ErrorCode::kUnsupported,
                      "{}: {}: group_size = {} is not supported (expected 32, 64 or 128)", src, where,
                      q.group_size);
  }
  return Status::ok();
}

Expected<QuantizationConfig> parse_quantization(const json& q, const std::string& block,
                                                const std::string& src) {
  if (!q.is_object()) {
    return make_error(ErrorCode::kInvalidArgument, "{}: '{}' must be an object, found {}", src, block,
                      q.dump());
  }
  if (q.contains("quant_method")) {
    return make_error(
        ErrorCode::kUnsupported,
        "{}: {}.quant_method = {} is not supported; PureDrive reads float checkpoints and MLX affine "
        "('quantization': {{bits, group_size}}) checkpoints",
        src, block, q["quant_method"].dump());
  }
  QuantizationConfig out;
  FieldReader r(q, block + ".", src);
  PD_TRY(r.int_field("bits", &out.global.bits, /*required=*/true));
  PD_TRY(r.int_field("group_size", &out.global.group_size, /*required=*/false));
  if (out.global.group_size == 0) out.global.group_size = 64;  // mlx-lm's default
  PD_TRY(r.string_field("mode", &out.mode));
  if (out.mode != "affine") {
    return make_error(ErrorCode::kUnsupported, "{}: {}.mode = '{}' is not supported (only 'affine')", src,
                      block, out.mode);
  }
  PD_TRY(check_quant_params(out.global, block, src));
  for (const auto& [key, v] : q.items()) {
    if (key == "bits" || key == "group_size" || key == "mode") continue;
    const std::string where = fmt::format("{}['{}']", block, key);
    if (v.is_boolean()) {
      // true = quantize with the global parameters; false = keep this module in float.
      out.overrides[key] = v.get<bool>() ? out.global : QuantParams{};
      continue;
    }
    if (!v.is_object()) continue;  // other scalar keys (tooling metadata) carry no per-module meaning
    QuantParams p = out.global;
    FieldReader o(v, where + ".", src);
    PD_TRY(o.int_field("bits", &p.bits, false));
    PD_TRY(o.int_field("group_size", &p.group_size, false));
    std::string mode = out.mode;
    PD_TRY(o.string_field("mode", &mode));
    if (mode != "affine") {
      return make_error(ErrorCode::kUnsupported, "{}: {}.mode = '{}' is not supported (only 'affine')", src,
                        where, mode);
    }
    PD_TRY(check_quant_params(p, where, src));
    out.overrides[key] = p;
  }
  return out;
}

// RoPE: rope_parameters (transformers 5) wins over the flat fields; legacy rope_scaling is read for its type.
Status parse_rope(const FieldReader& t, ModelConfig* c) {
  PD_TRY(t.double_field("rope_theta", &c->rope_theta, false));
  PD_TRY(t.double_field("partial_rotary_factor", &c->partial_rotary_factor, false));
  for (const char* block : {"rope_scaling", "rope_parameters"}) {
    const json* rp = t.get(block);
    if (rp == nullptr) continue;
    if (!rp->is_object()) return t.bad(block, "an object");
    FieldReader r(*rp, t.path(block) + ".", t.source());
    PD_TRY(r.double_field("rope_theta", &c->rope_theta, false));
    PD_TRY(r.double_field("partial_rotary_factor", &c->partial_rotary_factor, false));
    PD_TRY(r.string_field("rope_type", &c->rope_type));
    if (c->rope_type == "default") PD_TRY(r.string_field("type", &c->rope_type));  // older spelling
    PD_TRY(r.bool_field("mrope_interleaved", &c->mrope_interleaved));
    if (const json* ms = r.get("mrope_section")) {
      if (!ms->is_array()) return r.bad("mrope_section", "an array of integers");
      c->mrope_section.clear();
      for (const auto& x : *ms) {
        if (!x.is_number_integer() || x.get<int64_t>() < 0)
          return r.bad("mrope_section", "an array of integers");
        c->mrope_section.push_back(x.get<int>());
      }
    }
  }
  if (c->rope_type != "default" && c->rope_type != "mrope") {
    return make_error(ErrorCode::kUnsupported, "{}: rope_type '{}' is not supported (only 'default')",
                      t.source(), c->rope_type);
  }
  return Status::ok();
}

Status parse_layer_types(const FieldReader& t, ModelConfig* c) {
  PD_TRY(t.int_field("full_attention_interval", &c->full_attention_interval, false));
  if (const json* lt = t.get("layer_types")) {
    if (!lt->is_array()) return t.bad("layer_types", "an array of strings");
    for (size_t i = 0; i < lt->size(); ++i) {
      const json& v = (*lt)[i];
      const std::string s = v.is_string() ? v.get<std::string>() : v.dump();
      if (s == "linear_attention") {
        c->layer_types.push_back(LayerType::kLinearAttention);
      } else if (s == "full_attention") {
        c->layer_types.push_back(LayerType::kFullAttention);
      } else {
        return make_error(
            ErrorCode::kUnsupported,
            "{}: {}[{}] = {} is not a supported layer type ('linear_attention' or 'full_attention')",
            t.source(), t.path("layer_types"), i, v.dump());
      }
    }
    if (static_cast<int>(c->layer_types.size()) != c->num_hidden_layers) {
      return make_error(ErrorCode::kInvalidArgument, "{}: {} has {} entries but num_hidden_layers is {}",
                        t.source(), t.path("layer_types"), c->layer_types.size(), c->num_hidden_layers);
    }
    return Status::ok();
  }
  if (c->full_attention_interval == 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: neither '{}' nor '{}' is given; cannot tell GDN layers from attention layers",
                      t.source(), t.path("layer_types"), t.path("full_attention_interval"));
  }
  for (int i = 0; i < c->num_hidden_layers; ++i) {
    c->layer_types.push_back((i + 1) % c->full_attention_interval == 0 ? LayerType::kFullAttention
                                                                       : LayerType::kLinearAttention);
  }
  return Status::ok();
}

// Features of the config classes that these models never use; refusing them beats computing something else.
Status check_unsupported_features(const FieldReader& t, const ModelConfig& c) {
  if (const json* v = t.get("hidden_act"); v != nullptr && *v != "silu") {
    return make_error(ErrorCode::kUnsupported, "{}: {} = {} is not supported (only \"silu\")", t.source(),
                      t.path("hidden_act"), v->dump());
  }
  if (const json* v = t.get("attention_bias"); v != nullptr && *v != false) {
    return make_error(ErrorCode::kUnsupported, "{}: {} = true is not supported", t.source(),
                      t.path("attention_bias"));
  }
  if (const json* v = t.get("mlp_only_layers"); v != nullptr && !(v->is_array() && v->empty())) {
    return make_error(ErrorCode::kUnsupported,
                      "{}: {} = {}: dense MLP layers are not supported (every layer is MoE)", t.source(),
                      t.path("mlp_only_layers"), v->dump());
  }
  if (const json* v = t.get("decoder_sparse_step"); v != nullptr && *v != 1) {
    return make_error(ErrorCode::kUnsupported, "{}: {} = {}: only 1 (every layer is MoE) is supported",
                      t.source(), t.path("decoder_sparse_step"), v->dump());
  }
  if (const json* v = t.get("mtp_use_dedicated_embeddings"); v != nullptr && *v == true) {
    return make_error(ErrorCode::kUnsupported,
                      "{}: {} = true is not supported (the MTP head shares embed_tokens)", t.source(),
                      t.path("mtp_use_dedicated_embeddings"));
  }
  (void)c;
  return Status::ok();
}

Status validate(const ModelConfig& c, const std::string& src) {
  constexpr ErrorCode kBad = ErrorCode::kInvalidArgument;
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return make_error(kBad, "{}: num_attention_heads ({}) must be divisible by num_key_value_heads ({})", src,
                      c.num_attention_heads, c.num_key_value_heads);
  }
  if (c.num_linear_attention_layers() > 0 && c.linear_num_value_heads % c.linear_num_key_heads != 0) {
    return make_error(kBad, "{}: linear_num_value_heads ({}) must be divisible by linear_num_key_heads ({})",
                      src, c.linear_num_value_heads, c.linear_num_key_heads);
  }
  const double rd = c.head_dim * c.partial_rotary_factor;
  if (!(c.partial_rotary_factor > 0.0 && c.partial_rotary_factor <= 1.0) || rd != std::floor(rd) ||
      static_cast<int64_t>(rd) % 2 != 0) {
    return make_error(
        kBad,
        "{}: partial_rotary_factor {} with head_dim {} gives {} rotary dims; expected an even integer "
        "no larger than head_dim",
        src, c.partial_rotary_factor, c.head_dim, rd);
  }
  if (!(c.rope_theta > 0.0))
    return make_error(kBad, "{}: rope_theta must be positive, found {}", src, c.rope_theta);
  if (!(c.rms_norm_eps > 0.0)) {
    return make_error(kBad, "{}: rms_norm_eps must be positive, found {}", src, c.rms_norm_eps);
  }
  if (!c.mrope_section.empty()) {
    int sum = 0;
    for (int s : c.mrope_section) sum += s;
    if (sum != c.rotary_dim / 2) {
      return make_error(kBad, "{}: mrope_section [{}] sums to {}, expected rotary_dim / 2 = {}", src,
                        fmt::join(c.mrope_section, ", "), sum, c.rotary_dim / 2);
    }
  }
  if (c.num_experts_per_tok > c.num_experts) {
    return make_error(kBad, "{}: num_experts_per_tok ({}) exceeds num_experts ({})", src,
                      c.num_experts_per_tok, c.num_experts);
  }
  if (c.linear_conv_kernel_dim < 1) {
    return make_error(kBad, "{}: linear_conv_kernel_dim must be >= 1, found {}", src,
                      c.linear_conv_kernel_dim);
  }
  return Status::ok();
}

}  // namespace

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::kQwen3_5Moe:
      return "qwen3_5_moe";
    case Arch::kQwen3Next:
      return "qwen3_next";
  }
  return "?";
}

const std::vector<std::string>& supported_model_types() {
  static const std::vector<std::string> types = {"qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next"};
  return types;
}

int ModelConfig::num_full_attention_layers() const {
  int n = 0;
  for (LayerType t : layer_types) n += t == LayerType::kFullAttention ? 1 : 0;
  return n;
}

std::string layer_plan_string(const ModelConfig& c) {
  std::string s;
  for (size_t i = 0; i < c.layer_types.size(); ++i) {
    if (i > 0) s += ' ';
    s += c.layer_types[i] == LayerType::kFullAttention ? "ATTN" : "GDN";
  }
  return s;
}

Expected<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source) {
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    std::string why;
    try {
      const json unused = json::parse(json_text);
      (void)unused;
    } catch (const json::exception& e) {
      why = e.what();
    }
    return make_error(ErrorCode::kInvalidArgument, "{}: not valid JSON: {}", source, why);
  }
  if (!root.is_object()) return make_error(ErrorCode::kInvalidArgument, "{}: expected a JSON object", source);

  ModelConfig c;
  FieldReader top(root, "", source);
  PD_TRY(top.string_field("model_type", &c.model_type));
  if (c.model_type.empty()) {
    return make_error(ErrorCode::kInvalidArgument, "{}: missing 'model_type' (supported: {})", source,
                      fmt::join(supported_model_types(), ", "));
  }
  const json* text = &root;
  std::string prefix;
  if (c.model_type == "qwen3_5_moe") {
    c.arch = Arch::kQwen3_5Moe;
    text = top.get("text_config");
    if (text == nullptr || !text->is_object()) {
      return make_error(ErrorCode::kInvalidArgument,
                        "{}: model_type qwen3_5_moe needs a 'text_config' object", source);
    }
    prefix = "text_config.";
    c.has_vision = top.has("vision_config");
  } else if (c.model_type == "qwen3_5_moe_text") {
    c.arch = Arch::kQwen3_5Moe;
  } else if (c.model_type == "qwen3_next") {
    c.arch = Arch::kQwen3Next;
  } else {
    return make_error(ErrorCode::kUnsupported, "{}: model_type '{}' is not supported (supported: {})", source,
                      c.model_type, fmt::join(supported_model_types(), ", "));
  }
  FieldReader t(*text, prefix, source);
  c.text_model_type = c.model_type;
  PD_TRY(t.string_field("model_type", &c.text_model_type));
  if (c.model_type == "qwen3_5_moe" && c.text_model_type != "qwen3_5_moe_text") {
    return make_error(ErrorCode::kUnsupported,
                      "{}: text_config.model_type '{}' is not supported (expected "
                      "'qwen3_5_moe_text')",
                      source, c.text_model_type);
  }
  PD_TRY(top.string_field("torch_dtype", &c.torch_dtype));
  PD_TRY(top.string_field("dtype", &c.torch_dtype));
  if (c.torch_dtype.empty()) {
    PD_TRY(t.string_field("torch_dtype", &c.torch_dtype));
    PD_TRY(t.string_field("dtype", &c.torch_dtype));
  }

  PD_TRY(t.int_field("hidden_size", &c.hidden_size, true));
  PD_TRY(t.int_field("num_hidden_layers", &c.num_hidden_layers, true));
  PD_TRY(t.int_field("vocab_size", &c.vocab_size, true));
  PD_TRY(t.double_field("rms_norm_eps", &c.rms_norm_eps, false));
  PD_TRY(top.bool_field("tie_word_embeddings", &c.tie_word_embeddings));
  PD_TRY(t.bool_field("tie_word_embeddings", &c.tie_word_embeddings));  // the text model's value wins
  PD_TRY(t.int_field("max_position_embeddings", &c.max_position_embeddings, false));

  PD_TRY(t.int_field("num_attention_heads", &c.num_attention_heads, true));
  PD_TRY(t.int_field("num_key_value_heads", &c.num_key_value_heads, true));
  PD_TRY(t.int_field("head_dim", &c.head_dim, true));
  PD_TRY(t.bool_field("attn_output_gate", &c.attn_output_gate));
  PD_TRY(parse_rope(t, &c));
  // Out of (0, 1] the factor is an error (validate); converting its product to int first would be undefined.
  const bool factor_ok = c.partial_rotary_factor > 0.0 && c.partial_rotary_factor <= 1.0;
  c.rotary_dim = factor_ok ? static_cast<int>(c.head_dim * c.partial_rotary_factor) : 0;

  PD_TRY(parse_layer_types(t, &c));
  const bool has_gdn = c.num_linear_attention_layers() > 0;
  PD_TRY(t.int_field("linear_num_key_heads", &c.linear_num_key_heads, has_gdn));
  PD_TRY(t.int_field("linear_num_value_heads", &c.linear_num_value_heads, has_gdn));
  PD_TRY(t.int_field("linear_key_head_dim", &c.linear_key_head_dim, has_gdn));
  PD_TRY(t.int_field("linear_value_head_dim", &c.linear_value_head_dim, has_gdn));
  PD_TRY(t.int_field("linear_conv_kernel_dim", &c.linear_conv_kernel_dim, false));

  PD_TRY(t.int_field("num_experts", &c.num_experts, true));
  PD_TRY(t.int_field("num_experts_per_tok", &c.num_experts_per_tok, true));
  PD_TRY(t.int_field("moe_intermediate_size", &c.moe_intermediate_size, true));
  PD_TRY(t.int_field("shared_expert_intermediate_size", &c.shared_expert_intermediate_size, true));
  PD_TRY(t.bool_field("norm_topk_prob", &c.norm_topk_prob));

  for (const char* key : {"mtp_num_hidden_layers", "num_nextn_predict_layers"}) {
    if (t.has(key)) {
      PD_TRY(t.int_field(key, &c.mtp_num_hidden_layers, true, /*min_value=*/0));
      c.mtp_layers_explicit = true;
      break;
    }
  }
  PD_TRY(check_unsupported_features(t, c));

  // mlx-lm writes the block at the top level (also for nested configs) and copies it to quantization_config.
  for (const char* block : {"quantization", "quantization_config"}) {
    const json* q = top.get(block);
    if (q == nullptr) q = prefix.empty() ? nullptr : t.get(block);
    if (q == nullptr) continue;
    PD_ASSIGN_OR_RETURN(QuantizationConfig qc, parse_quantization(*q, block, source));
    c.quantization = std::move(qc);
    break;
  }
  PD_TRY(validate(c, source));
  return c;
}

Expected<ModelConfig> load_model_config(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "config.json").string();
  PD_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  return parse_model_config(text, path);
}

}  // namespace pd
