#include "puredrive/tokenizer/json_util.h"

#include <nlohmann/json.hpp>

namespace pd::tok {

Expected<std::string> json_string(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object())
    return make_error(ErrorCode::kCorrupt, "{}: expected an object, found {}", where, j.type_name());
  const auto it = j.find(key);
  if (it == j.end()) return make_error(ErrorCode::kCorrupt, "{}: missing field '{}'", where, key);
  if (!it->is_string()) {
    return make_error(ErrorCode::kCorrupt, "{}.{}: expected a string, found {}", where, key, it->type_name());
  }
  return it->get<std::string>();
}

Expected<bool> json_bool(const nlohmann::json& j, const char* key, const std::string& where, bool fallback) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    return make_error(ErrorCode::kCorrupt, "{}.{}: expected a boolean, found {}", where, key,
                      it->type_name());
  }
  return it->get<bool>();
}

Expected<PatternSpec> parse_pattern(const nlohmann::json& j, const std::string& where) {
  const auto it = j.find("pattern");
  if (it == j.end() || !it->is_object() || it->size() != 1) {
    return make_error(ErrorCode::kCorrupt, "{}.pattern: expected {{\"Regex\": ...}} or {{\"String\": ...}}",
                      where);
  }
  PatternSpec spec;
  if (it->contains("Regex")) {
    spec.is_regex = true;
    PD_ASSIGN_OR_RETURN(spec.text, json_string(*it, "Regex", where + ".pattern"));
  } else if (it->contains("String")) {
    PD_ASSIGN_OR_RETURN(spec.text, json_string(*it, "String", where + ".pattern"));
  } else {
    return make_error(ErrorCode::kCorrupt,
                      "{}.pattern: expected {{\"Regex\": ...}} or {{\"String\": ...}}, found {}", where,
                      it->dump());
  }
  return spec;
}

}  // namespace pd::tok
