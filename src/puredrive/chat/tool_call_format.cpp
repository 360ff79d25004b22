#include "puredrive/chat/tool_call_format.h"

#include <algorithm>
#include <cctype>

#include "puredrive/chat/jinja/py_format.h"
#include "puredrive/chat/jinja/template.h"

namespace pd::chat {

using ojson = nlohmann::ordered_json;

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The schema's type names, in order ("type": "integer" or "type": ["integer", "null"]).
std::vector<std::string> schema_types(const ojson* schema) {
  std::vector<std::string> types;
  if (schema == nullptr || !schema->is_object() || !schema->contains("type")) {
    // enum / anyOf without a type: treat as string.
    return types;
  }
  const ojson& t = (*schema)["type"];
  if (t.is_string()) types.push_back(lower(t.get<std::string>()));
  if (t.is_array()) {
    for (const auto& x : t) {
      if (x.is_string()) types.push_back(lower(x.get<std::string>()));
    }
  }
  return types;
}

std::optional<ojson> as_integer(std::string_view text) {
  const std::string_view t = trim(text);
  size_t i = (!t.empty() && (t[0] == '-' || t[0] == '+')) ? 1 : 0;
  if (i >= t.size()) return std::nullopt;
  for (size_t k = i; k < t.size(); ++k) {
    if (!std::isdigit(static_cast<unsigned char>(t[k]))) return std::nullopt;
  }
  ojson v = ojson::parse(t[0] == '+' ? t.substr(1) : t, nullptr, false);
  if (v.is_discarded() || !v.is_number()) return std::nullopt;
  return v;
}

std::optional<ojson> as_number(std::string_view text) {
  const std::string_view t = trim(text);
  if (t.empty()) return std::nullopt;
  ojson v = ojson::parse(t[0] == '+' ? t.substr(1) : t, nullptr, false);
  if (v.is_discarded() || !v.is_number()) return std::nullopt;
  return v;
}

std::optional<ojson> as_json_container(std::string_view text, bool want_object) {
  ojson v = ojson::parse(trim(text), nullptr, false);
  if (v.is_discarded()) return std::nullopt;
  if (want_object ? !v.is_object() : !v.is_array()) return std::nullopt;
  return v;
}

}  // namespace

ToolSchemas::ToolSchemas(const ojson& tools) {
  if (!tools.is_array()) return;
  for (const auto& tool : tools) {
    const ojson* fn = &tool;
    if (tool.is_object() && tool.contains("function") && tool["function"].is_object()) fn = &tool["function"];
    if (!fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) continue;
    ojson props = ojson::object();
    if (fn->contains("parameters") && (*fn)["parameters"].is_object() &&
        (*fn)["parameters"].contains("properties") && (*fn)["parameters"]["properties"].is_object()) {
      props = (*fn)["parameters"]["properties"];
    }
    tools_[(*fn)["name"].get<std::string>()] = std::move(props);
  }
}

const ojson* ToolSchemas::parameter(std::string_view tool, std::string_view param) const {
  auto it = tools_.find(std::string(tool));
  if (it == tools_.end()) return nullptr;
  auto p = it->second.find(std::string(param));
  return p == it->second.end() ? nullptr : &*p;
}

ojson typed_parameter_value(const std::string& raw, const ojson* schema) {
  const std::vector<std::string> types = schema_types(schema);
  for (const std::string& type : types) {
    if (type == "string" || type == "str" || type == "text") return raw;
    if (type == "null" && (trim(raw) == "null" || trim(raw) == "None")) return nullptr;
    if (type == "integer" || type == "int") {
      if (auto v = as_integer(raw)) return *v;
    } else if (type == "number" || type == "float") {
      if (auto v = as_number(raw)) return *v;
    } else if (type == "boolean" || type == "bool") {
      const std::string t = lower(trim(raw));
      if (t == "true") return true;
      if (t == "false") return false;
    } else if (type == "object" || type == "dict") {
      if (auto v = as_json_container(raw, true)) return *v;
    } else if (type == "array" || type == "list") {
      if (auto v = as_json_container(raw, false)) return *v;
    }
  }
  return raw;  // unknown parameter, untyped schema, or a value that does not parse: keep the text
}

std::optional<std::string> python_json_dumps(const ojson& value) {
  auto v = jinja::value_from_json(value);
  if (!v.has_value()) return std::nullopt;
  return jinja::json_dumps(*v, jinja::JsonOptions{});
}

std::optional<ToolCall> parse_xml_tool_call(std::string_view body, const ToolSchemas& schemas) {
  std::string_view s = trim(body);
  constexpr std::string_view kFunctionOpen = "<function=";
  constexpr std::string_view kFunctionClose = "</function>";
  constexpr std::string_view kParamOpen = "<parameter=";
  constexpr std::string_view kParamClose = "</parameter>";
  if (s.substr(0, kFunctionOpen.size()) != kFunctionOpen) return std::nullopt;
  const size_t name_end = s.find('>');
  if (name_end == std::string_view::npos) return std::nullopt;
  ToolCall call;
  call.name = std::string(trim(s.substr(kFunctionOpen.size(), name_end - kFunctionOpen.size())));
  if (call.name.empty() || call.name.find_first_of("<\n") != std::string::npos) return std::nullopt;
  if (s.size() < kFunctionClose.size() || s.substr(s.size() - kFunctionClose.size()) != kFunctionClose) {
    return std::nullopt;
  }
  std::string_view rest = s.substr(name_end + 1, s.size() - kFunctionClose.size() - name_end - 1);
  ojson args = ojson::object();
  for (;;) {
    rest = trim(rest);
    if (rest.empty()) break;
    if (rest.substr(0, kParamOpen.size()) != kParamOpen) return std::nullopt;
    const size_t pname_end = rest.find('>');
    if (pname_end == std::string_view::npos) return std::nullopt;
    const std::string pname(trim(rest.substr(kParamOpen.size(), pname_end - kParamOpen.size())));
    if (pname.empty() || pname.find_first_of("<\n") != std::string::npos) return std::nullopt;
    const size_t close = rest.find(kParamClose, pname_end + 1);
    if (close == std::string_view::npos) return std::nullopt;
    std::string_view value = rest.substr(pname_end + 1, close - pname_end - 1);
    // The templates write "<parameter=ARG>\n" VALUE "\n</parameter>": drop exactly those two newlines.
    if (!value.empty() && value.front() == '\n') value.remove_prefix(1);
    if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
    args[pname] = typed_parameter_value(std::string(value), schemas.parameter(call.name, pname));
    rest.remove_prefix(close + kParamClose.size());
  }
  auto text = python_json_dumps(args);
  if (!text) return std::nullopt;
  call.arguments = std::move(*text);
  return call;
}

std::optional<ToolCall> parse_json_tool_call(std::string_view body) {
  ojson j = ojson::parse(trim(body), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string())
    return std::nullopt;
  ToolCall call;
  call.name = j["name"].get<std::string>();
  if (call.name.empty()) return std::nullopt;
  ojson args = ojson::object();
  const char* key =
      j.contains("arguments") ? "arguments" : (j.contains("parameters") ? "parameters" : nullptr);
  if (key != nullptr) {
    const ojson& a = j[key];
    if (a.is_object()) {
      args = a;
    } else if (a.is_string()) {
      ojson parsed = ojson::parse(a.get<std::string>(), nullptr, false);
      if (parsed.is_discarded() || !parsed.is_object()) return std::nullopt;
      args = std::move(parsed);
    } else if (!a.is_null()) {
      return std::nullopt;
    }
  }
  auto text = python_json_dumps(args);
  if (!text) return std::nullopt;
  call.arguments = std::move(*text);
  return call;
}

}  // namespace pd::chat
