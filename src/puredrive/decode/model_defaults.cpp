#include "puredrive/decode/model_defaults.h"

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "puredrive/util/mapped_file.h"

namespace pd {
namespace {

using Json = nlohmann::json;

// The parsed file, or null when it does not exist.
Expected<Json> read_json_if_present(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return Json();
  PD_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return make_error(ErrorCode::kCorrupt, "{}: not a JSON object", path);
  }
  return j;
}

// eos_token_id as an int or a list of ints; null/absent -> false.
Expected<bool> read_ids(const Json& obj, const std::string& where, std::vector<int32_t>* out) {
  const auto it = obj.find("eos_token_id");
  if (it == obj.end() || it->is_null()) return false;
  auto one = [&](const Json& v) -> Status {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
      return make_error(ErrorCode::kCorrupt,
                        "{}: eos_token_id must be a non-negative integer or a list of them, "
                        "found {}",
                        where, v.dump());
    }
    out->push_back(v.get<int32_t>());
    return Status::ok();
  };
  if (it->is_array()) {
    for (const Json& v : *it) PD_TRY(one(v));
  } else {
    PD_TRY(one(*it));
  }
  return true;
}

template <typename T>
Status read_number(const Json& obj, const char* key, const std::string& where, std::optional<T>* out) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return Status::ok();
  if (!it->is_number()) {
    return make_error(ErrorCode::kCorrupt, "{}: {} must be a number, found {}", where, key, it->dump());
  }
  *out = it->get<T>();
  return Status::ok();
}

}  // namespace

SamplingParams GenerationDefaults::sampling() const {
  SamplingParams p;
  if (!do_sample.value_or(false)) {
    p.temperature = 0.0f;
    return p;
  }
  if (temperature) p.temperature = *temperature;
  if (top_p) p.top_p = *top_p;
  if (top_k) p.top_k = *top_k;
  if (min_p) p.min_p = *min_p;
  if (repetition_penalty) p.repetition_penalty = *repetition_penalty;
  return p;
}

Expected<GenerationDefaults> load_generation_defaults(const std::string& model_dir,
                                                      const Tokenizer* tokenizer) {
  GenerationDefaults d;
  const std::string gen_path = model_dir + "/generation_config.json";
  PD_ASSIGN_OR_RETURN(Json gen, read_json_if_present(gen_path));
  bool have_ids = false;
  if (gen.is_object()) {
    PD_ASSIGN_OR_RETURN(have_ids, read_ids(gen, gen_path, &d.eos_token_ids));
    if (const auto it = gen.find("do_sample"); it != gen.end() && !it->is_null()) {
      if (!it->is_boolean()) {
        return make_error(ErrorCode::kCorrupt, "{}: do_sample must be true or false, found {}", gen_path,
                          it->dump());
      }
      d.do_sample = it->get<bool>();
    }
    PD_TRY(read_number(gen, "temperature", gen_path, &d.temperature));
    PD_TRY(read_number(gen, "top_p", gen_path, &d.top_p));
    PD_TRY(read_number(gen, "top_k", gen_path, &d.top_k));
    PD_TRY(read_number(gen, "min_p", gen_path, &d.min_p));
    PD_TRY(read_number(gen, "repetition_penalty", gen_path, &d.repetition_penalty));
  }
  if (!have_ids) {
    const std::string cfg_path = model_dir + "/config.json";
    PD_ASSIGN_OR_RETURN(Json cfg, read_json_if_present(cfg_path));
    if (cfg.is_object()) {
      PD_ASSIGN_OR_RETURN(have_ids, read_ids(cfg, cfg_path, &d.eos_token_ids));
      if (!have_ids && cfg.contains("text_config") && cfg["text_config"].is_object()) {
        PD_ASSIGN_OR_RETURN(have_ids,
                            read_ids(cfg["text_config"], cfg_path + " text_config", &d.eos_token_ids));
      }
    }
  }
  if (tokenizer != nullptr) {
    if (std::optional<int32_t> eos = tokenizer->eos_token_id()) d.eos_token_ids.push_back(*eos);
  }
  std::sort(d.eos_token_ids.begin(), d.eos_token_ids.end());
  d.eos_token_ids.erase(std::unique(d.eos_token_ids.begin(), d.eos_token_ids.end()), d.eos_token_ids.end());
  return d;
}

}  // namespace pd
