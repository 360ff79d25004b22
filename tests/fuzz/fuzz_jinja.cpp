// Fuzz target: the Jinja lexer, parser and interpreter. The input is a template; it is rendered with a
// chat-like context under tight render limits (a hostile template must end with an error, not hang).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "puredrive/chat/jinja/template.h"

namespace {

const nlohmann::ordered_json& context() {
  static const auto ctx = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are terse."},
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "reasoning_content": "look it up",
       "tool_calls": [{"id": "c1", "type": "function",
                       "function": {"name": "get_weather", "arguments": {"city": "Paris", "n": [1, 2.5, null]}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "{\"t\": 21}"},
      {"role": "user", "content": [{"type": "text", "text": "thanks"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    "add_generation_prompt": true, "enable_thinking": false,
    "bos_token": "<s>", "eos_token": "</s>"
  })");
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto tmpl = pd::jinja::Template::parse(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  if (!tmpl) return 0;
  pd::jinja::RenderOptions options;
  options.limits.max_output_bytes = 1 << 20;
  options.limits.max_loop_iterations = 100'000;
  options.limits.max_call_depth = 50;
  options.fixed_now = std::tm{};
  (void)tmpl->render(context(), options);
  return 0;
}
