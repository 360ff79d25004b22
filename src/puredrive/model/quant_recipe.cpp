// The quantization recipes (quantize.h): names, which module class a tensor belongs to, and the bits and
// group size each recipe gives it, following mlx-lm's quantize_model.

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <string>

#include "puredrive/model/quantize.h"

namespace pd {

Expected<QuantRecipe> parse_quant_recipe(const std::string& name) {
  for (QuantRecipe r :
       {QuantRecipe::kQ8, QuantRecipe::kQ6, QuantRecipe::kQ5, QuantRecipe::kQ4, QuantRecipe::kOq6e}) {
    if (name == quant_recipe_name(r)) return r;
  }
  return make_error(ErrorCode::kInvalidArgument, "unknown recipe '{}' (expected q8, q6, q5, q4 or oq6e)",
                    name);
}

const char* quant_recipe_name(QuantRecipe r) {
  switch (r) {
    case QuantRecipe::kQ8:
      return "q8";
    case QuantRecipe::kQ6:
      return "q6";
    case QuantRecipe::kQ5:
      return "q5";
    case QuantRecipe::kQ4:
      return "q4";
    case QuantRecipe::kOq6e:
      return "oq6e";
  }
  return "?";
}

const char* module_class_name(ModuleClass c) {
  switch (c) {
    case ModuleClass::kEmbedding:
      return "embedding";
    case ModuleClass::kLmHead:
      return "lm_head";
    case ModuleClass::kAttention:
      return "attention";
    case ModuleClass::kGdn:
      return "gdn";
    case ModuleClass::kRouter:
      return "router";
    case ModuleClass::kSharedExpert:
      return "shared_expert";
    case ModuleClass::kRoutedExperts:
      return "routed_experts";
    case ModuleClass::kMtpFc:
      return "mtp_fc";
    case ModuleClass::kOther:
      return "other";
  }
  return "?";
}

ModuleClass classify_module(const std::string& m) {
  if (m == "model.embed_tokens") return ModuleClass::kEmbedding;
  if (m == "lm_head") return ModuleClass::kLmHead;
  if (m == "mtp.fc") return ModuleClass::kMtpFc;
  if (m.ends_with(".mlp.gate") || m.ends_with(".mlp.shared_expert_gate")) return ModuleClass::kRouter;
  const size_t dot = m.rfind('.');
  if (dot == std::string::npos) return ModuleClass::kOther;
  const std::string parent = m.substr(0, dot), leaf = m.substr(dot + 1);
  auto in = [&](std::initializer_list<const char*> names) {
    return std::any_of(names.begin(), names.end(), [&](const char* n) { return leaf == n; });
  };
  if (parent.ends_with(".self_attn") && in({"q_proj", "k_proj", "v_proj", "o_proj"})) {
    return ModuleClass::kAttention;
  }
  if (parent.ends_with(".linear_attn") &&
      in({"in_proj_qkvz", "in_proj_ba", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"})) {
    return ModuleClass::kGdn;
  }
  if (parent.ends_with(".mlp.shared_expert") && in({"gate_proj", "up_proj", "down_proj"})) {
    return ModuleClass::kSharedExpert;
  }
  if (in({"gate_proj", "up_proj", "down_proj", "gate_up_proj"})) {
    // .mlp.switch_mlp.X, .mlp.experts.X (fused) or .mlp.experts.<e>.X
    if (parent.ends_with(".mlp.switch_mlp") || parent.ends_with(".mlp.experts")) {
      return ModuleClass::kRoutedExperts;
    }
    const size_t d2 = parent.rfind('.');
    if (d2 != std::string::npos && d2 + 1 < parent.size() &&
        std::all_of(parent.begin() + static_cast<std::ptrdiff_t>(d2 + 1), parent.end(),
                    [](char ch) { return ch >= '0' && ch <= '9'; }) &&
        parent.substr(0, d2).ends_with(".mlp.experts")) {
      return ModuleClass::kRoutedExperts;
    }
  }
  return ModuleClass::kOther;
}

QuantParams recipe_global(QuantRecipe r, int group_size) {
  switch (r) {
    case QuantRecipe::kQ8:
      return {8, group_size};
    case QuantRecipe::kQ6:
      return {6, group_size};
    case QuantRecipe::kQ5:
      return {5, group_size};
    case QuantRecipe::kQ4:
      return {4, group_size};
    case QuantRecipe::kOq6e:
      return {8, 64};
  }
  return {};
}

QuantParams recipe_params(QuantRecipe r, int group_size, ModuleClass c) {
  if (c == ModuleClass::kRouter) return {8, 64};
  if (r == QuantRecipe::kOq6e && c == ModuleClass::kRoutedExperts) return {6, 64};
  return recipe_global(r, group_size);
}

std::optional<QuantParams> module_quant_params(QuantRecipe r, int group_size, ModuleClass c, int64_t cols) {
  if (c == ModuleClass::kOther) return std::nullopt;
  const QuantParams p = recipe_params(r, group_size, c);
  // mlx-lm's quantize_model: a module is quantized only when its input width is a multiple of the global
  // group size; the override's own group must divide it too, or mx.quantize would refuse it.
  if (cols % group_size != 0 || cols % p.group_size != 0) return std::nullopt;
  return p;
}

}  // namespace pd
