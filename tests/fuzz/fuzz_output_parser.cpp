// Fuzz target: the incremental output parser (content / <think> reasoning / tool calls in the JSON and XML
// formats) fed the generated text token by token, as the server does. The first byte picks the options,
// the next ones how the rest is cut into deltas. Checks the property the streaming delta builder relies on
// (output_parser.h): between two feeds the parse only grows.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include <nlohmann/json.hpp>

#include "puredrive/chat/output_parser.h"

namespace {

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

void check_grows(const pd::chat::ParsedMessage& before, const pd::chat::ParsedMessage& after) {
  if (!starts_with(after.content, before.content) ||
      !starts_with(after.reasoning_content, before.reasoning_content) ||
      after.tool_calls.size() < before.tool_calls.size()) {
    std::abort();
  }
  for (size_t i = 0; i < before.tool_calls.size(); ++i) {
    const auto& b = before.tool_calls[i];
    const auto& a = after.tool_calls[i];
    if ((!b.name.empty() && a.name != b.name) || !starts_with(a.arguments, b.arguments)) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const uint8_t flags = data[0];
  pd::chat::OutputParserOptions o;
  o.parse_reasoning = flags & 1;
  o.starts_in_reasoning = flags & 2;
  o.parse_tool_calls = flags & 4;
  if (flags & 8) {
    o.tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
      "exact": {"type": "boolean"}, "tags": {"type": "array"}}}}}])");
  }
  uint32_t state = data[1] | (static_cast<uint32_t>(data[2]) << 8) | 1u;
  std::string_view text(reinterpret_cast<const char*>(data + 3), size - 3);
  pd::chat::OutputParser parser(o);
  pd::chat::ParsedMessage last;
  while (!text.empty()) {
    state = state * 1103515245u + 12345u;  // token lengths of 1..8 bytes, cut anywhere (even mid-character)
    const size_t n = std::min<size_t>(text.size(), 1 + (state >> 16) % 8);
    parser.feed(text.substr(0, n));
    text.remove_prefix(n);
    check_grows(last, parser.message());
    last = parser.message();
  }
  const pd::chat::ParsedMessage final_message = parser.finish();
  (void)final_message;
  return 0;
}
