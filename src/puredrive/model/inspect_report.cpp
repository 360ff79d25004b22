#include "puredrive/model/inspect_report.h"

#include <cstdio>
#include <cstring>
#include <map>

#include "puredrive/checkpoint/tensor_names.h"
#include "puredrive/model/quantize.h"

namespace pd {
namespace {

using json = nlohmann::json;

const int64_t kReportContexts[] = {2048, 16384, 131072};

json config_json(const ModelConfig& c) {
  json j = {
      {"hidden_size", c.hidden_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"vocab_size", c.vocab_size},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim},
      {"rotary_dim", c.rotary_dim},
      {"rope_theta", c.rope_theta},
      {"linear_num_key_heads", c.linear_num_key_heads},
      {"linear_num_value_heads", c.linear_num_value_heads},
      {"linear_key_head_dim", c.linear_key_head_dim},
      {"linear_value_head_dim", c.linear_value_head_dim},
      {"linear_conv_kernel_dim", c.linear_conv_kernel_dim},
      {"num_experts", c.num_experts},
      {"num_experts_per_tok", c.num_experts_per_tok},
      {"moe_intermediate_size", c.moe_intermediate_size},
      {"shared_expert_intermediate_size", c.shared_expert_intermediate_size},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"mtp_num_hidden_layers", c.mtp_num_hidden_layers},
      {"rms_norm_eps", c.rms_norm_eps},
  };
  if (!c.mrope_section.empty()) j["mrope_section"] = c.mrope_section;
  return j;
}

// Bits per weight of the matrices, by module class: stored bytes (codes + scales + biases for MLX affine)
// over logical weights.
json bits_per_weight_json(const Checkpoint& cp) {
  struct Acc {
    double params = 0;
    double bytes = 0;
  };
  std::map<std::string, Acc> by;
  Acc total;
  for (const auto& t : cp.tensors) {
    std::string module = canonical_tensor_name(t.name);
    bool scales = false;
    for (const char* sfx : {".weight", ".scales", ".biases"}) {
      const size_t n = std::strlen(sfx);
      if (module.size() > n && module.compare(module.size() - n, n, sfx) == 0) {
        scales = std::strcmp(sfx, ".scales") == 0;
        module.resize(module.size() - n);
        break;
      }
    }
    const ModuleClass c = classify_module(module);
    if (c == ModuleClass::kOther || t.shape.size() < 2) continue;
    Acc& a = by[module_class_name(c)];
    a.bytes += static_cast<double>(t.nbytes);
    total.bytes += static_cast<double>(t.nbytes);
    int bits = 0, group = 0;
    const bool affine = std::sscanf(t.format.c_str(), "affine q%d g%d", &bits, &group) == 2;
    double n = 1;
    for (int64_t d : t.shape) n *= static_cast<double>(d);
    // Logical weights: a float matrix's elements, or an affine module's groups times the group size.
    if ((affine && scales) || (!affine && t.dtype != DType::kU32)) {
      const double params = affine ? n * group : n;
      a.params += params;
      total.params += params;
    }
  }
  json j = json::object();
  for (const auto& [k, a] : by) {
    j[k] = {{"params", a.params},
            {"bytes", a.bytes},
            {"bits_per_weight", a.params > 0 ? 8 * a.bytes / a.params : 0}};
  }
  j["all"] = {{"params", total.params},
              {"bytes", total.bytes},
              {"bits_per_weight", total.params > 0 ? 8 * total.bytes / total.params : 0}};
  return j;
}

}  // namespace

json inspect_json(const InspectInput& in) {
  const ModelConfig& c = in.checkpoint != nullptr ? in.checkpoint->config : *in.config;
  const MemoryPlan plan =
      plan_memory(c, in.checkpoint != nullptr ? &in.checkpoint->weights : nullptr, in.ctx_size);
  const ParamCounts& p = plan.params;
  json j;
  j["dir"] = in.dir;
  j["model_type"] = c.model_type;
  j["text_model_type"] = c.text_model_type;
  j["arch"] = arch_name(c.arch);
  j["weights"] = in.checkpoint != nullptr ? "loaded" : "config-only";
  j["config"] = config_json(c);
  j["layer_plan"] = layer_plan_string(c);
  j["layers"] = {{"total", c.num_hidden_layers},
                 {"full_attention", c.num_full_attention_layers()},
                 {"linear_attention", c.num_linear_attention_layers()},
                 {"mtp", c.mtp_num_hidden_layers}};
  if (c.quantization) {
    json q = {{"bits", c.quantization->global.bits},
              {"group_size", c.quantization->global.group_size},
              {"mode", c.quantization->mode}};
    for (const auto& [k, v] : c.quantization->overrides) {
      q["overrides"][k] = v.bits == 0 ? json(false) : json{{"bits", v.bits}, {"group_size", v.group_size}};
    }
    j["quantization"] = q;
  }
  if (in.checkpoint != nullptr) {
    const Checkpoint& cp = *in.checkpoint;
    j["expert_layout"] = cp.expert_layout;
    j["norms_stored_as"] = cp.norms_shifted_in_file ? "1+w (MLX-sanitized)" : "w (HF, +1 folded at load)";
    json tensors = json::array();
    for (const auto& t : cp.tensors) {
      tensors.push_back({{"name", t.name},
                         {"dtype", dtype_name(t.dtype)},
                         {"shape", t.shape},
                         {"format", t.format},
                         {"bytes", t.nbytes}});
    }
    j["tensors"] = tensors;
    j["unused"] = cp.unused;
    j["notices"] = cp.notices;
    j["bits_per_weight"] = bits_per_weight_json(cp);
  }
  j["params"] = {{"total", p.total()},
                 {"main", p.main()},
                 {"mtp", p.mtp},
                 {"embedding", p.embedding},
                 {"lm_head", p.lm_head},
                 {"dense", p.dense},
                 {"experts", p.experts},
                 {"active_per_token", p.active()},
                 {"active_dense", p.active_dense},
                 {"active_experts", p.active_experts}};
  json notes = json::array();
  if (in.checkpoint == nullptr && !c.mtp_layers_explicit) {
    notes.push_back(
        "config.json does not give the number of MTP layers; the loader uses 1 when the checkpoint "
        "has mtp.* tensors (published Qwen3-Next checkpoints do), so MTP is left out of these figures");
  }
  j["notes"] = notes;
  j["memory"] = {{"ctx_size", plan.ctx_size},
                 {"estimated_from_config", !plan.from_weights},
                 {"weight_bytes", plan.weight_bytes},
                 {"kv_bytes_per_token", plan.kv_bytes_per_token},
                 {"mtp_kv_bytes_per_token", plan.mtp_kv_bytes_per_token},
                 {"kv_bytes", plan.kv_bytes()},
                 {"gdn_conv_bytes", plan.gdn_conv_bytes},
                 {"gdn_recurrent_bytes", plan.gdn_recurrent_bytes},
                 {"total_bytes", plan.total_bytes()}};
  if (auto avail = available_memory_bytes()) {
    j["memory"]["available_bytes"] = *avail;
    j["memory"]["fits_available"] = check_memory_fits(plan, *avail, in.dir).is_ok();
  }
  json by_ctx = json::array();
  auto decode_at = [&](int64_t ctx) {
    const int64_t b = plan.bytes_per_decode_token(ctx);
    return json{{"context", ctx},
                {"bytes_per_token", b},
                {"floor_tokens_per_s", kH200CopyBandwidth / static_cast<double>(b)}};
  };
  for (int64_t ctx : kReportContexts) {
    if (ctx != plan.ctx_size) by_ctx.push_back(decode_at(ctx));
  }
  j["decode"] = {{"weight_bytes_per_token", plan.dense_bytes_per_token + plan.expert_bytes_per_token},
                 {"dense_bytes_per_token", plan.dense_bytes_per_token},
                 {"expert_bytes_per_token", plan.expert_bytes_per_token},
                 {"at_ctx_size", decode_at(plan.ctx_size)},
                 {"by_context", by_ctx},
                 {"bandwidth_bytes_per_s", kH200CopyBandwidth},
                 {"bandwidth_source", "H200 measured copy bandwidth, docs/DESIGN.md §8"}};
  return j;
}

std::string inspect_text(const InspectInput& in) {
  const json j = inspect_json(in);
  const auto& cfg = j["config"];
  const auto& p = j["params"];
  const auto& m = j["memory"];
  const auto& d = j["decode"];
  auto bytes = [](const json& v) { return format_bytes(v.get<double>()); };
  auto count = [](const json& v) { return format_count(v.get<double>()); };
  std::string s;
  auto line = [&](const std::string& l) {
    s += l;
    s += '\n';
  };
  line(fmt::format("model      {} ({}), arch {}, weights: {}", j["dir"].get<std::string>(),
                   j["model_type"].get<std::string>(), j["arch"].get<std::string>(),
                   j["weights"].get<std::string>()));
  line(fmt::format("sizes      H={} V={} heads {}q/{}kv x {} (rotary {}), GDN {}k/{}v heads x {}/{}, conv {}",
                   cfg["hidden_size"].get<int>(), cfg["vocab_size"].get<int>(),
                   cfg["num_attention_heads"].get<int>(), cfg["num_key_value_heads"].get<int>(),
                   cfg["head_dim"].get<int>(), cfg["rotary_dim"].get<int>(),
                   cfg["linear_num_key_heads"].get<int>(), cfg["linear_num_value_heads"].get<int>(),
                   cfg["linear_key_head_dim"].get<int>(), cfg["linear_value_head_dim"].get<int>(),
                   cfg["linear_conv_kernel_dim"].get<int>()));
  line(fmt::format("moe        {} experts, top-{}, expert width {}, shared expert width {}",
                   cfg["num_experts"].get<int>(), cfg["num_experts_per_tok"].get<int>(),
                   cfg["moe_intermediate_size"].get<int>(),
                   cfg["shared_expert_intermediate_size"].get<int>()));
  line(fmt::format("layers     {} ({} GDN, {} attention), MTP layers {}", j["layers"]["total"].get<int>(),
                   j["layers"]["linear_attention"].get<int>(), j["layers"]["full_attention"].get<int>(),
                   j["layers"]["mtp"].get<int>()));
  line(fmt::format("plan       {}", j["layer_plan"].get<std::string>()));
  if (j.contains("quantization")) {
    const auto& q = j["quantization"];
    line(fmt::format("quant      MLX affine {}-bit, group {}, {} per-module overrides", q["bits"].get<int>(),
                     q["group_size"].get<int>(), q.contains("overrides") ? q["overrides"].size() : 0));
  }
  if (j.contains("tensors")) {
    line(fmt::format("experts    stored {}; norms stored as {}", j["expert_layout"].get<std::string>(),
                     j["norms_stored_as"].get<std::string>()));
    line(fmt::format("tensors    {}", j["tensors"].size()));
    for (const auto& t : j["tensors"]) {
      line(fmt::format("  {:<64} {:<8} {:<20} {}", t["name"].get<std::string>(),
                       t["dtype"].get<std::string>(),
                       fmt::format("[{}]", fmt::join(t["shape"].get<std::vector<int64_t>>(), ", ")),
                       t["format"].get<std::string>()));
    }
    std::string bpw;
    for (const auto& [k, v] : j["bits_per_weight"].items()) {
      if (k == "all") continue;
      bpw += fmt::format("{}{} {:.2f}", bpw.empty() ? "" : ", ", k, v["bits_per_weight"].get<double>());
    }
    line(fmt::format("bits/weight {:.2f} over all matrices: {}",
                     j["bits_per_weight"]["all"]["bits_per_weight"].get<double>(), bpw));
    for (const auto& n : j["notices"]) line(fmt::format("notice     {}", n.get<std::string>()));
    if (!j["unused"].empty()) line(fmt::format("UNUSED     {} tensors (listed above)", j["unused"].size()));
  }
  line(fmt::format("params     total {} (main {}, MTP {}); active per token {} = {} dense + {} experts",
                   count(p["total"]), count(p["main"]), count(p["mtp"]), count(p["active_per_token"]),
                   count(p["active_dense"]), count(p["active_experts"])));
  line(fmt::format(
      "memory     weights {}{}; KV {} per token ({} + MTP {}), {} at --ctx-size {}; GDN state {} "
      "(conv {} + recurrent {}); total {}",
      bytes(m["weight_bytes"]), m["estimated_from_config"].get<bool>() ? " (estimated from config)" : "",
      bytes(json(m["kv_bytes_per_token"].get<int64_t>() + m["mtp_kv_bytes_per_token"].get<int64_t>())),
      bytes(m["kv_bytes_per_token"]), bytes(m["mtp_kv_bytes_per_token"]), bytes(m["kv_bytes"]),
      m["ctx_size"].get<int64_t>(),
      bytes(json(m["gdn_conv_bytes"].get<int64_t>() + m["gdn_recurrent_bytes"].get<int64_t>())),
      bytes(m["gdn_conv_bytes"]), bytes(m["gdn_recurrent_bytes"]), bytes(m["total_bytes"])));
  if (m.contains("available_bytes")) {
    line(fmt::format("host       MemAvailable {}: the plan {}", bytes(m["available_bytes"]),
                     m["fits_available"].get<bool>() ? "fits" : "does NOT fit"));
  }
  for (const auto& n : j["notes"]) line(fmt::format("note       {}", n.get<std::string>()));
  line(fmt::format("decode     weights read per token {} ({} dense + {} experts)",
                   bytes(d["weight_bytes_per_token"]), bytes(d["dense_bytes_per_token"]),
                   bytes(d["expert_bytes_per_token"])));
  line(fmt::format("floor      at {:.2f} TB/s ({}):", d["bandwidth_bytes_per_s"].get<double>() / 1e12,
                   d["bandwidth_source"].get<std::string>()));
  auto floor_line = [&](const json& e, const char* tag) {
    line(fmt::format("  context {:>7}: {} per token -> {:.0f} tok/s{}", e["context"].get<int64_t>(),
                     bytes(e["bytes_per_token"]), e["floor_tokens_per_s"].get<double>(), tag));
  };
  floor_line(d["at_ctx_size"], "  (--ctx-size)");
  for (const auto& e : d["by_context"]) floor_line(e, "");
  return s;
}

}  // namespace pd
