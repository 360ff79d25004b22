// Parsing one complete tool-call block, the text between <tool_call> and </tool_call>, in the two formats
// the Qwen family emits:
//   XML (Qwen3-Coder, Qwen3.5):  <function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n...</function>
//   JSON (Qwen2.5, Qwen3, Hermes): {"name": NAME, "arguments": {...}}
// XML parameter values are typed by the tool's JSON schema when one is known (integer, number, boolean,
// object, array, null parsed; string kept verbatim; anything unparsable stays a string).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace pd::chat {

// ASCII whitespace, as the chat templates' markup and Python's str.strip() take it.
inline bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object, serialized like Python's json.dumps(ensure_ascii=False)
};

// Per-tool parameter schemas taken from the request's `tools` list.
class ToolSchemas {
 public:
  ToolSchemas() = default;
  // Accepts OpenAI-style [{"type": "function", "function": {...}}] and bare [{"name": ..., "parameters":
  // ...}].
  explicit ToolSchemas(const nlohmann::ordered_json& tools);
  bool empty() const { return tools_.empty(); }
  bool has_tool(std::string_view name) const { return tools_.count(std::string(name)) > 0; }
  // The JSON schema of one parameter, or nullptr when unknown.
  const nlohmann::ordered_json* parameter(std::string_view tool, std::string_view param) const;

 private:
  std::unordered_map<std::string, nlohmann::ordered_json> tools_;  // name -> parameters.properties
};

// nullopt when the block is not a well-formed tool call (the caller keeps it as text).
std::optional<ToolCall> parse_xml_tool_call(std::string_view body, const ToolSchemas& schemas);
std::optional<ToolCall> parse_json_tool_call(std::string_view body);

// An XML parameter value typed by its schema (exposed for tests).
nlohmann::ordered_json typed_parameter_value(const std::string& raw, const nlohmann::ordered_json* schema);

// json.dumps(value, ensure_ascii=False) of a JSON value (Python separators and float formatting); nullopt
// for values nested too deeply to be arguments.
std::optional<std::string> python_json_dumps(const nlohmann::ordered_json& value);

}  // namespace pd::chat
