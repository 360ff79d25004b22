#include "puredrive/checkpoint/loader.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>

#include "puredrive/checkpoint/affine.h"
#include "puredrive/checkpoint/qkvz_reorder.h"
#include "puredrive/checkpoint/tensor_names.h"
#include "puredrive/util/log.h"

namespace pd {
namespace {

bool starts_with(const std::string& s, const char* p) {
  return s.rfind(p, 0) == 0;
}

std::string shape_str(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

int64_t product(const std::vector<int64_t>& v) {
  int64_t n = 1;
  for (int64_t d : v) n *= d;
  return n;
}

float read_float(const TensorInfo& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, t.data + 4 * i, 4);
      return f;
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      return bf16_to_f32(h);
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      return f16_to_f32(h);
    }
    default:
      PD_ASSERT(false, "read_float on {}", dtype_name(t.dtype));
  }
  return 0.0f;
}

bool is_float(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16;
}

class Binder {
 public:
  Binder(const ModelConfig& config, const TensorStore& store, const LoadOptions& options, Checkpoint* out)
      : c_(config), store_(store), opt_(options), out_(out) {}

  Status run();

 private:
  struct Entry {
    const TensorInfo* t = nullptr;
    bool used = false;
    std::string format;
  };

  Status index_tensors();
  void detect_layouts();
  Status bind_layer(const std::string& p, LayerType type, bool shifted, LayerWeights* w);
  Status bind_attention(const std::string& p, bool shifted, AttentionWeights* w);
  Status bind_gdn(const std::string& p, GdnWeights* w);
  Status bind_moe(const std::string& p, MoeWeights* w);
  Status bind_experts(const std::string& p, MoeWeights* w, std::string* layout);
  Status bind_mtp();
  void finish_listing();

  Entry* find(const std::string& cname) {
    auto it = by_name_.find(cname);
    return it == by_name_.end() ? nullptr : &it->second;
  }
  bool has(const std::string& cname) const { return by_name_.count(cname) > 0; }
  // The canonical name spelled with the checkpoint's own prefixes, for messages.
  std::string display(const std::string& cname) const;
  Status missing(const std::string& cname, const std::vector<int64_t>& want) const {
    return make_error(ErrorCode::kNotFound, "{}: missing tensor '{}' (expected shape {})", out_->dir,
                      display(cname), shape_str(want));
  }
  Status wrong_shape(const std::string& cname, const std::vector<int64_t>& want,
                     const std::vector<int64_t>& got, const char* what = "") const {
    return make_error(ErrorCode::kInvalidArgument, "{}: tensor '{}'{}: expected shape {}, file has {}",
                      out_->dir, display(cname), what, shape_str(want), shape_str(got));
  }
  std::optional<QuantParams> expected_quant(const std::string& module) const;
  const void* data_of(const TensorInfo& t);

  // Module `m` stored as [lead..., rows, cols] (cols packed when quantized), returned as a 2-D matrix
  // [product(lead) * rows, cols].
  Expected<Matrix> matrix(const std::string& m, const std::vector<int64_t>& lead, int64_t rows, int64_t cols);
  Expected<Matrix> affine_matrix(const std::string& m, const std::string& wname, Entry* w, Entry* scales,
                                 const std::vector<int64_t>& want, int64_t cols);
  Expected<std::vector<float>> vec(const std::string& name, int64_t len, bool zero_centred, bool shifted);
  Expected<std::vector<float>> conv(const std::string& name, int64_t channels, int64_t taps);

  const ModelConfig& c_;
  const TensorStore& store_;
  const LoadOptions& opt_;
  Checkpoint* out_;
  std::unordered_map<std::string, Entry> by_name_;
  std::unordered_map<std::string, const char*> stored_prefix_;  // canonical prefix -> stored prefix
  std::unordered_map<std::string, QuantParams> overrides_;      // canonical module path -> params
  std::optional<bool> conv_mlx_layout_;  // from the first conv1d: [C, K, 1] (MLX) or [C, 1, K] (HF)
  bool main_shifted_ = false;
  bool mtp_shifted_ = false;
  bool skip_mtp_ = false;
  size_t vision_count_ = 0;
};

std::string Binder::display(const std::string& cname) const {
  for (const char* canon : {"model.", "mtp.", "lm_head."}) {
    if (starts_with(cname, canon)) {
      auto it = stored_prefix_.find(canon);
      if (it != stored_prefix_.end()) return it->second + cname.substr(std::strlen(canon));
    }
  }
  return cname;
}

Status Binder::index_tensors() {
  for (const auto& t : store_.tensors()) {
    const NamePrefix* r = match_name_prefix(t.name);
    if (r != nullptr && r->canonical == nullptr) {
      ++vision_count_;
      continue;
    }
    std::string cname = canonical_tensor_name(t.name);
    if (r != nullptr) stored_prefix_.emplace(r->canonical, r->stored);
    auto [it, inserted] = by_name_.emplace(cname, Entry{&t, false, {}});
    if (!inserted) {
      return make_error(ErrorCode::kInvalidArgument, "{}: tensors '{}' and '{}' both name '{}'", out_->dir,
                        it->second.t->name, t.name, cname);
    }
  }
  if (c_.quantization) {
    for (const auto& [key, q] : c_.quantization->overrides) {
      std::string k = canonical_tensor_name(key + ".");
      if (!k.empty()) k.pop_back();
      overrides_[k] = q;
    }
  }
  return Status::ok();
}

// spec §3: an MLX-sanitized checkpoint stores conv1d as [C, K, 1] and norms as 1 + w; HF stores [C, 1, K] and
// w.
void Binder::detect_layouts() {
  std::optional<bool> main;
  for (int i = 0; i < c_.num_hidden_layers && !main; ++i) {
    const Entry* e = find(fmt::format("model.layers.{}.linear_attn.conv1d.weight", i));
    if (e == nullptr || e->t->shape.size() != 3) continue;
    const auto& s = e->t->shape;
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

std::optional<QuantParams> Binder::expected_quant(const std::string& module) const {
  if (!c_.quantization) return std::nullopt;
  auto it = overrides_.find(module);
  if (it != overrides_.end()) return it->second;
  return c_.quantization->global;
}

const void* Binder::data_of(const TensorInfo& t) {
  const size_t align = dtype_size(t.dtype);
  if (reinterpret_cast<uintptr_t>(t.data) % align == 0) return t.data;
  // safetensors does not promise alignment; kernels read whole elements, so misaligned tensors get a copy.
  auto buf = std::make_shared<std::vector<uint8_t>>(t.data, t.data + t.nbytes);
  out_->weights.storage.push_back(buf);
  PD_LOG_DEBUG("{}: '{}' is not {}-byte aligned in the file; copied", out_->dir, t.name, align);
  return buf->data();
}

Expected<Matrix> Binder::matrix(const std::string& m, const std::vector<int64_t>& lead, int64_t rows,
                                int64_t cols) {
  std::vector<int64_t> want = lead;
  want.push_back(rows);
  want.push_back(cols);
  std::string wname = m + ".weight";
  Entry* w = find(wname);
  if (w == nullptr && (w = find(m)) != nullptr) wname = m;  // fused experts carry no ".weight" suffix
  if (w == nullptr) return missing(m + ".weight", want);
  if (Entry* scales = find(m + ".scales")) return affine_matrix(m, wname, w, scales, want, cols);

  const TensorInfo& t = *w->t;
  Matrix out;
  switch (t.dtype) {
    case DType::kF32:
      out.format = WeightFormat::kF32;
      break;
    case DType::kBF16:
      out.format = WeightFormat::kBF16;
      break;
    case DType::kF16:
      out.format = WeightFormat::kF16;
      break;
    case DType::kU32:
      return make_error(ErrorCode::kInvalidArgument,
                        "{}: tensor '{}' is U32 (packed codes) but '{}' is missing", out_->dir, t.name,
                        display(m + ".scales"));
    default:
      return make_error(ErrorCode::kUnsupported,
                        "{}: tensor '{}' has dtype {}; matrices must be F32, BF16, F16 or "
                        "MLX affine (U32 + scales + biases)",
                        out_->dir, t.name, dtype_name(t.dtype));
  }
  if (t.shape != want) return wrong_shape(wname, want, t.shape);
  out.rows = product(lead) * rows;
  out.cols = cols;
  out.data = data_of(t);
  out.name = m;
  w->used = true;
  w->format = weight_format_name(out.format);
  return out;
}

Expected<Matrix> Binder::affine_matrix(const std::string& m, const std::string& wname, Entry* w, Entry* sc,
                                       const std::vector<int64_t>& want, int64_t cols) {
  Entry* bi = find(m + ".biases");
  if (bi == nullptr) {
    return make_error(ErrorCode::kNotFound, "{}: '{}' exists but '{}' is missing (MLX affine needs both)",
                      out_->dir, display(m + ".scales"), display(m + ".biases"));
  }
  const TensorInfo& t = *w->t;
  const TensorInfo& s = *sc->t;
  const TensorInfo& b = *bi->t;
  if (t.dtype != DType::kU32) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: '{}' has scales, so it must hold U32 packed codes; found {}", out_->dir, t.name,
                      dtype_name(t.dtype));
  }
  if (!is_float(s.dtype) || b.dtype != s.dtype) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: '{}' is {} and '{}' is {}; expected the same float dtype", out_->dir, s.name,
                      dtype_name(s.dtype), b.name, dtype_name(b.dtype));
  }
  // Everything but the last dim must match the float shape; the last dims give bits and group size.
  const std::vector<int64_t> outer(want.begin(), want.end() - 1);
  auto outer_ok = [&](const std::vector<int64_t>& sh) {
    return sh.size() == want.size() && std::equal(outer.begin(), outer.end(), sh.begin());
  };
  if (!outer_ok(t.shape)) {
    return wrong_shape(wname, want, t.shape, " (quantized: last dim = packed words)");
  }
  if (!outer_ok(s.shape) || s.shape.back() <= 0) {
    return wrong_shape(m + ".scales", want, s.shape, " (scales: last dim = groups)");
  }
  if (b.shape != s.shape) return wrong_shape(m + ".biases", s.shape, b.shape);
  const int64_t groups = s.shape.back();
  const int64_t packed = t.shape.back();
  if (cols % groups != 0 || (packed * 32) % cols != 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: '{}': {} packed words and {} groups do not fit an input width of {}", out_->dir,
                      t.name, packed, groups, cols);
  }
  const int gs = static_cast<int>(cols / groups);
  const int bits = static_cast<int>(packed * 32 / cols);
  if (!affine_bits_supported(bits) || (gs != 32 && gs != 64 && gs != 128)) {
    return make_error(
        ErrorCode::kUnsupported,
        "{}: '{}': shapes imply {} bits and group size {}; supported are bits 2-6, 8 and groups 32, 64, "
        "128",
        out_->dir, t.name, bits, gs);
  }
  if (auto q = expected_quant(m)) {
    if (q->bits == 0) {
      return make_error(ErrorCode::kInvalidArgument, "{}: config.json keeps '{}' in float, but '{}' exists",
                        out_->dir, display(m), display(m + ".scales"));
    }
    if (q->bits != bits || q->group_size != gs) {
      return make_error(ErrorCode::kInvalidArgument,
                        "{}: '{}': config.json says {}-bit group {}, the tensor shapes say {}-bit group {}",
                        out_->dir, display(m), q->bits, q->group_size, bits, gs);
    }
  }
  Matrix out;
  out.format = WeightFormat::kAffine;
  out.rows = product(outer);
  out.cols = cols;
  out.bits = bits;
  out.group_size = gs;
  out.scale_dtype = s.dtype;
  out.data = data_of(t);
  out.scales = data_of(s);
  out.biases = data_of(b);
  out.name = m;
  const std::string f = fmt::format("affine q{} g{}", bits, gs);
  w->used = sc->used = bi->used = true;
  w->format = f;
  sc->format = f + " scales";
  bi->format = f + " biases";
  return out;
}

Expected<std::vector<float>> Binder::vec(const std::string& name, int64_t len, bool zero_centred,
                                         bool shifted) {
  Entry* e = find(name);
  if (e == nullptr) return missing(name, {len});
  const TensorInfo& t = *e->t;
  if (t.shape != std::vector<int64_t>{len}) return wrong_shape(name, {len}, t.shape);
  if (!is_float(t.dtype)) {
    return make_error(ErrorCode::kInvalidArgument, "{}: '{}' has dtype {}, expected F32, BF16 or F16",
                      out_->dir, t.name, dtype_name(t.dtype));
  }
  std::vector<float> v(static_cast<size_t>(len));
  const bool add_one = zero_centred && !shifted;
  for (int64_t i = 0; i < len; ++i) v[i] = add_one ? 1.0f + read_float(t, i) : read_float(t, i);
  e->used = true;
  e->format = add_one        ? "norm, 1+w folded -> f32"
              : zero_centred ? "norm (file has 1+w) -> f32"
                             : "vector -> f32";
  return v;
}

Expected<std::vector<float>> Binder::conv(const std::string& name, int64_t channels, int64_t taps) {
  Entry* e = find(name);
  if (e == nullptr) return missing(name, {channels, 1, taps});
  const TensorInfo& t = *e->t;
  const std::vector<int64_t> hf{channels, 1, taps}, mlx{channels, taps, 1};
  // Both layouts hold the taps of a channel contiguously, so one read serves either.
  if (t.shape != hf && t.shape != mlx) {
    return wrong_shape(name, hf, t.shape, " (or MLX layout [C, K, 1])");
  }
  if (taps > 1 && conv_mlx_layout_ && (t.shape == mlx) != *conv_mlx_layout_) {
    return make_error(
        ErrorCode::kInvalidArgument,
        "{}: '{}' is stored {} but the first GDN layer's conv1d uses the {} layout; mixed layouts are "
        "refused because the layout decides whether norms get +1",
        out_->dir, t.name, shape_str(t.shape), *conv_mlx_layout_ ? "MLX [C, K, 1]" : "HF [C, 1, K]");
  }
  if (!is_float(t.dtype)) {
    return make_error(ErrorCode::kInvalidArgument, "{}: '{}' has dtype {}, expected F32, BF16 or F16",
                      out_->dir, t.name, dtype_name(t.dtype));
  }
  std::vector<float> v(static_cast<size_t>(channels * taps));
  for (int64_t i = 0; i < channels * taps; ++i) v[i] = read_float(t, i);
  e->used = true;
  e->format = "conv taps -> f32";
  return v;
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
        if (Entry* e = find(a + n + suffix)) e->format += ", re-ordered to q|k|v, z, b, a";
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
  if (out_->expert_layout.empty() && starts_with(p, "model.")) out_->expert_layout = layout;
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
  for (const auto& [name, e] : by_name_) {
    if (!starts_with(name, "mtp.")) continue;
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
  for (const auto& t : store_.tensors()) {
    TensorListing l{t.name, t.dtype, t.shape, t.nbytes, {}, t.file};
    const std::string cname = canonical_tensor_name(t.name);
    if (cname.empty()) {
      l.format = "ignored (vision tower)";
    } else if (skip_mtp_ && starts_with(cname, "mtp.")) {
      l.format = "ignored (MTP not loaded)";
    } else if (const Entry* e = find(cname); e != nullptr && e->used) {
      l.format = e->format;
    } else {
      l.format = "UNUSED";
      out_->unused.push_back(t.name);
    }
    out_->tensors.push_back(std::move(l));
  }
  std::sort(out_->tensors.begin(), out_->tensors.end(),
            [](const TensorListing& a, const TensorListing& b) { return natural_less(a.name, b.name); });
  std::sort(out_->unused.begin(), out_->unused.end(), natural_less);
}

Status Binder::run() {
  out_->config = c_;
  for (const auto& f : store_.files()) out_->weights.storage.push_back(f.mapping());
  PD_TRY(index_tensors());
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

  if (vision_count_ > 0) {
    out_->notices.push_back(
        fmt::format("skipped {} vision-tower tensors: PureDrive runs the text model only", vision_count_));
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
