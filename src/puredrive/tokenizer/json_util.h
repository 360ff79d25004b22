// Field accessors for tokenizer.json / tokenizer_config.json that turn type mismatches into Status
// errors naming the JSON location.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "puredrive/util/status.h"

namespace pd::tok {

// A required string field.
Expected<std::string> json_string(const nlohmann::json& j, const char* key, const std::string& where);
// An optional boolean field (missing or null: `fallback`).
Expected<bool> json_bool(const nlohmann::json& j, const char* key, const std::string& where, bool fallback);

// The "pattern" field of Split / Replace: {"Regex": "..."} or {"String": "..."}.
struct PatternSpec {
  bool is_regex = false;
  std::string text;
};
Expected<PatternSpec> parse_pattern(const nlohmann::json& j, const std::string& where);

}  // namespace pd::tok
