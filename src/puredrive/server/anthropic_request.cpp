#include "puredrive/server/anthropic_request.h"

#include <limits>
#include <set>

#include <fmt/format.h>

namespace pd::server {
namespace {

ChatMessage message(std::string role, std::string content = "") {
  ChatMessage m;
  m.role = std::move(role);
  m.content = std::move(content);
  return m;
}

bool expect_object(FieldReader& f, const RequestJson& v, const std::string& path) {
  if (v.is_object()) return true;
  return f.fail(
      invalid_request(fmt::format("Invalid type for '{}': expected an object.", path), path, "invalid_type"));
}

// A block this server cannot take: media (a text-only model) or a type the position does not allow.
bool refuse_block(FieldReader& f, const std::string& type, const std::string& path, const char* expected) {
  const std::string param = param_name(path, "type");
  if (type == "image" || type == "document" || type == "search_result" || type == "container_upload") {
    return f.fail(invalid_request(
        fmt::format("Content block type '{}' in '{}' is not supported: this server runs a text-only model. "
                    "Send text blocks only.",
                    type, path),
        param, "unsupported_content_type"));
  }
  return f.fail(invalid_request(
      fmt::format("Invalid value for '{}': content block type '{}' is not supported here; expected {}.",
                  param, type, expected),
      param, "invalid_value"));
}

// Reads one block's "type"; false (error recorded) when the block is not an object with a string type.
bool block_type(FieldReader& f, const RequestJson& block, const std::string& path, std::string* type) {
  if (!expect_object(f, block, path)) return false;
  FieldReader bf(block, path);
  if (!bf.require_string("type", type)) return f.fail(*bf.error());
  return true;
}

bool block_string(FieldReader& f, const RequestJson& block, const std::string& path, const char* key,
                  std::string* out) {
  FieldReader bf(block, path);
  if (!bf.require_string(key, out)) return f.fail(*bf.error());
  return true;
}

// System prompt and tool results: a string or text blocks, joined as sent (as for OpenAI text parts).
bool read_text_content(FieldReader& f, const RequestJson& v, const std::string& path, std::string* out) {
  if (v.is_string()) {
    *out = v.get<std::string>();
    return true;
  }
  if (!v.is_array()) {
    return f.fail(invalid_request(
        fmt::format("Invalid type for '{}': expected a string or an array of text blocks.", path), path,
        "invalid_type"));
  }
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string path_i = param_index(path, i);
    std::string type, text;
    if (!block_type(f, v[i], path_i, &type)) return false;
    if (type != "text") return refuse_block(f, type, path_i, "'text'");
    if (!block_string(f, v[i], path_i, "text", &text)) return false;
    *out += text;
  }
  return true;
}

bool expect_blocks(FieldReader& f, const RequestJson& content, const std::string& path) {
  if (!content.is_array()) {
    return f.fail(invalid_request(
        fmt::format("Invalid type for '{}': expected a string or an array of content blocks.", path), path,
        "invalid_type"));
  }
  if (content.empty()) {
    return f.fail(invalid_request(
        fmt::format("Invalid value for '{}': expected at least one content block, but got an empty array.",
                    path),
        path, "empty_array"));
  }
  return true;
}

// A user turn: consecutive text blocks become one user message, each tool_result a tool message, in order.
bool read_user(FieldReader& f, const RequestJson& content, const std::string& path,
               std::vector<ChatMessage>* out) {
  if (content.is_string()) {
    out->push_back(message("user", content.get<std::string>()));
    return true;
  }
  if (!expect_blocks(f, content, path)) return false;
  std::optional<std::string> text;
  auto flush_text = [&] {
    if (text) out->push_back(message("user", std::move(*text)));
    text.reset();
  };
  for (size_t i = 0; i < content.size(); ++i) {
    const RequestJson& block = content[i];
    const std::string path_i = param_index(path, i);
    std::string type;
    if (!block_type(f, block, path_i, &type)) return false;
    if (type == "text") {
      std::string t;
      if (!block_string(f, block, path_i, "text", &t)) return false;
      text = text.value_or("") + t;
    } else if (type == "tool_result") {
      flush_text();
      ChatMessage m = message("tool");
      FieldReader bf(block, path_i);
      std::optional<bool> is_error;
      if (!bf.require_string("tool_use_id", &m.tool_call_id) || !bf.get_bool("is_error", &is_error))
        return f.fail(*bf.error());
      if (const RequestJson* c = bf.find("content")) {
        if (!read_text_content(f, *c, param_name(path_i, "content"), &m.content)) return false;
      }
      out->push_back(std::move(m));
    } else {
      return refuse_block(f, type, path_i, "'text' or 'tool_result'");
    }
  }
  flush_text();
  return true;
}

bool read_tool_use(FieldReader& f, const RequestJson& block, const std::string& path, ChatMessage* m) {
  FieldReader bf(block, path);
  ToolCall call;
  if (!bf.require_string("id", &call.id) || !bf.require_string("name", &call.name))
    return f.fail(*bf.error());
  const RequestJson* input = bf.find("input");
  if (!input) {
    return f.fail(invalid_request(fmt::format("Missing required parameter: '{}'.", bf.name("input")),
                                  bf.name("input"), "missing_required_parameter"));
  }
  if (!input->is_object()) {
    bf.type_error("input", "an object");
    return f.fail(*bf.error());
  }
  call.arguments = input->dump();  // the prompt builder hands it to the template as an object again
  m->tool_calls.push_back(std::move(call));
  return true;
}

bool read_assistant(FieldReader& f, const RequestJson& content, const std::string& path, ChatMessage* m) {
  m->role = "assistant";
  if (content.is_string()) {
    m->content = content.get<std::string>();
    return true;
  }
  if (!expect_blocks(f, content, path)) return false;
  bool any_text = false;
  for (size_t i = 0; i < content.size(); ++i) {
    const RequestJson& block = content[i];
    const std::string path_i = param_index(path, i);
    std::string type;
    if (!block_type(f, block, path_i, &type)) return false;
    if (type == "text") {
      std::string t;
      if (!block_string(f, block, path_i, "text", &t)) return false;
      m->content += t;
      any_text = true;
    } else if (type == "thinking") {
      std::string t;
      if (!block_string(f, block, path_i, "thinking", &t)) return false;
      m->reasoning_content += t;
    } else if (type == "redacted_thinking") {
      // Opaque data meant for Anthropic's own models: nothing a chat template can show.
    } else if (type == "tool_use") {
      if (!read_tool_use(f, block, path_i, m)) return false;
    } else {
      return refuse_block(f, type, path_i, "'text', 'thinking' or 'tool_use'");
    }
  }
  // A turn that only calls tools has no content (as OpenAI's null), which templates render as nothing.
  m->content_is_null = !any_text && !m->tool_calls.empty();
  return true;
}

bool read_messages(FieldReader& f, ChatPrompt* prompt) {
  const RequestJson* messages = f.find("messages");
  if (!messages) {
    return f.fail(
        invalid_request("Missing required parameter: 'messages'.", "messages", "missing_required_parameter"));
  }
  if (!messages->is_array()) return f.type_error("messages", "an array");
  if (messages->empty()) {
    return f.fail(invalid_request(
        "Invalid value for 'messages': expected an array with at least one message, but got an empty array.",
        "messages", "empty_array"));
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    const RequestJson& message = (*messages)[i];
    const std::string path = param_index("messages", i);
    if (!expect_object(f, message, path)) return false;
    FieldReader mf(message, path);
    std::string role;
    if (!mf.require_string("role", &role)) return f.fail(*mf.error());
    const RequestJson* content = mf.find("content");
    if (!content) {
      return f.fail(invalid_request(fmt::format("Missing required parameter: '{}'.", mf.name("content")),
                                    mf.name("content"), "missing_required_parameter"));
    }
    if (role == "user") {
      if (!read_user(f, *content, mf.name("content"), &prompt->messages)) return false;
    } else if (role == "assistant") {
      if (i + 1 == messages->size()) {
        return f.fail(invalid_request(
            fmt::format(
                "A final assistant message ('{}') asks the model to continue it (prefill), which this "
                "server does not support. End the conversation with a user message.",
                path),
            path, "unsupported_value"));
      }
      ChatMessage m;
      if (!read_assistant(f, *content, mf.name("content"), &m)) return false;
      prompt->messages.push_back(std::move(m));
    } else {
      return f.fail(invalid_request(
          fmt::format("Invalid value for '{}': '{}' is not a supported role; expected 'user' or 'assistant' "
                      "(the system prompt is the top-level 'system' parameter).",
                      mf.name("role"), role),
          mf.name("role"), "invalid_value"));
    }
  }
  return true;
}

bool read_system(FieldReader& f, ChatPrompt* prompt) {
  const RequestJson* system = f.find("system");
  if (!system) return true;
  std::string text;
  if (!read_text_content(f, *system, "system", &text)) return false;
  if (!text.empty()) {
    prompt->messages.insert(prompt->messages.begin(), message("system", std::move(text)));
  }
  return true;
}

// Anthropic tools become OpenAI-style function tools, the form the chat templates and the output parser take.
bool read_anthropic_tools(FieldReader& f, ChatPrompt* prompt) {
  const RequestJson* tools = f.find("tools");
  if (!tools) return true;
  if (!tools->is_array()) return f.type_error("tools", "an array");
  std::set<std::string> names;
  for (size_t i = 0; i < tools->size(); ++i) {
    const std::string path = param_index("tools", i);
    if (!expect_object(f, (*tools)[i], path)) return false;
    FieldReader tf((*tools)[i], path);
    std::optional<std::string> type, description;
    std::string name;
    if (!tf.get_string("type", &type)) return f.fail(*tf.error());
    if (type && *type != "custom") {
      return f.fail(invalid_request(
          fmt::format("Tool type '{}' in '{}' is not supported: this server has no server-side or "
                      "Anthropic-defined tools. Define custom tools with name, description and input_schema.",
                      *type, path),
          tf.name("type"), "unsupported_value"));
    }
    if (!tf.require_string("name", &name) || !tf.get_string("description", &description))
      return f.fail(*tf.error());
    if (!is_valid_function_name(name)) {
      return f.fail(invalid_request(
          fmt::format("Invalid value for '{}': '{}' does not match '^[a-zA-Z0-9_-]{{1,64}}$'.",
                      tf.name("name"), name),
          tf.name("name"), "invalid_value"));
    }
    if (!names.insert(name).second) {
      return f.fail(invalid_request(fmt::format("Duplicate tool name '{}' in '{}'.", name, path),
                                    tf.name("name"), "invalid_value"));
    }
    const RequestJson* schema = tf.find("input_schema");
    if (!schema) {
      return f.fail(invalid_request(fmt::format("Missing required parameter: '{}'.", tf.name("input_schema")),
                                    tf.name("input_schema"), "missing_required_parameter"));
    }
    if (!schema->is_object()) {
      tf.type_error("input_schema", "a JSON Schema object");
      return f.fail(*tf.error());
    }
    RequestJson fn = {{"name", name}};
    if (description) fn["description"] = *description;
    fn["parameters"] = *schema;
    prompt->tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return true;
}

bool read_tool_choice(FieldReader& f, MessagesRequest* out) {
  const RequestJson* choice = f.find("tool_choice");
  if (!choice) return true;
  if (!choice->is_object()) return f.type_error("tool_choice", "an object");
  FieldReader cf(*choice, "tool_choice");
  std::string type;
  std::optional<bool> no_parallel;
  if (!cf.require_string("type", &type) || !cf.get_bool("disable_parallel_tool_use", &no_parallel))
    return f.fail(*cf.error());
  ToolChoice& tc = out->prompt.tool_choice;
  if (type == "auto") {
    tc.mode = ToolChoice::Mode::kAuto;
  } else if (type == "any") {
    tc.mode = ToolChoice::Mode::kRequired;
  } else if (type == "none") {
    tc.mode = ToolChoice::Mode::kNone;
  } else if (type == "tool") {
    if (!cf.require_string("name", &tc.function_name)) return f.fail(*cf.error());
    tc.mode = ToolChoice::Mode::kFunction;
  } else {
    return f.fail(invalid_request(
        fmt::format(
            "Invalid value for 'tool_choice.type': expected 'auto', 'any', 'tool' or 'none', but got '{}'.",
            type),
        "tool_choice.type", "invalid_value"));
  }
  out->parallel_tool_calls = !no_parallel.value_or(false);
  const bool needs_tools = tc.mode == ToolChoice::Mode::kRequired || tc.mode == ToolChoice::Mode::kFunction;
  if (needs_tools && out->prompt.tools.empty()) {
    return f.fail(invalid_request("'tool_choice' requires 'tools': send the tools the model may call.",
                                  "tool_choice", "invalid_value"));
  }
  if (tc.mode == ToolChoice::Mode::kFunction) {
    bool found = false;
    for (const auto& t : out->prompt.tools) found = found || t["function"]["name"] == tc.function_name;
    if (!found) {
      return f.fail(invalid_request(
          fmt::format("Invalid value for 'tool_choice.name': tool '{}' is not among the request's tools.",
                      tc.function_name),
          "tool_choice.name", "invalid_value"));
    }
  }
  return true;
}

// Anthropic's thinking switch is the chat template's enable_thinking. Without it the template's default
// holds (Qwen3.5 thinks), as on the OpenAI endpoint. The budget cannot be enforced (the model ends its
// reasoning itself, or max_tokens does); it is validated as Anthropic does.
bool read_thinking(FieldReader& f, MessagesCall call, MessagesRequest* out) {
  const RequestJson* thinking = f.find("thinking");
  if (!thinking) return true;
  if (!thinking->is_object()) return f.type_error("thinking", "an object");
  FieldReader tf(*thinking, "thinking");
  std::string type;
  if (!tf.require_string("type", &type)) return f.fail(*tf.error());
  bool enable = true;
  if (type == "enabled") {
    std::optional<int64_t> budget;
    if (!tf.get_int("budget_tokens", 1024, std::numeric_limits<int32_t>::max(), &budget))
      return f.fail(*tf.error());
    if (!budget) {
      return f.fail(invalid_request("Missing required parameter: 'thinking.budget_tokens'.",
                                    "thinking.budget_tokens", "missing_required_parameter"));
    }
    if (call == MessagesCall::kCreate && out->common.max_tokens && *budget >= *out->common.max_tokens) {
      return f.fail(
          invalid_request(fmt::format("'max_tokens' ({}) must be greater than 'thinking.budget_tokens' ({}).",
                                      *out->common.max_tokens, *budget),
                          "thinking.budget_tokens", "invalid_value"));
    }
  } else if (type == "disabled") {
    enable = false;
  } else if (type != "adaptive") {
    return f.fail(invalid_request(
        fmt::format(
            "Invalid value for 'thinking.type': expected 'enabled', 'adaptive' or 'disabled', but got '{}'.",
            type),
        "thinking.type", "invalid_value"));
  }
  out->prompt.template_kwargs["enable_thinking"] = enable;
  return true;
}

bool read_stop_sequences(FieldReader& f, std::vector<std::string>* out) {
  const RequestJson* v = f.find("stop_sequences");
  if (!v) return true;
  if (!v->is_array()) return f.type_error("stop_sequences", "an array of strings");
  if (v->size() > kMaxStopSequences) {
    return f.value_error("stop_sequences", fmt::format("at most {} stop sequences are allowed, but got {}.",
                                                       kMaxStopSequences, v->size()));
  }
  for (const auto& s : *v) {
    if (!s.is_string()) return f.type_error("stop_sequences", "an array of strings");
    out->push_back(s.get<std::string>());
  }
  return true;
}

// Structured outputs would need constrained decoding, which this server does not have: refusing them is
// honest, ignoring them is not. The effort level is a hint and is ignored.
bool reject_output_format(FieldReader& f) {
  const RequestJson* config = f.find("output_config");
  if (!config) return true;
  if (!config->is_object()) return f.type_error("output_config", "an object");
  if (FieldReader(*config, "output_config").has("format")) {
    return f.fail(invalid_request(
        "Structured outputs ('output_config.format') are not supported: this server has no constrained "
        "decoding. Ask for JSON in the prompt instead.",
        "output_config.format", "unsupported_parameter"));
  }
  return true;
}

bool read_generation_fields(FieldReader& f, MessagesRequest* out) {
  std::optional<int64_t> max_tokens;
  if (!f.get_int("max_tokens", 1, std::numeric_limits<int32_t>::max(), &max_tokens)) return false;
  if (!max_tokens) {
    return f.fail(invalid_request("Missing required parameter: 'max_tokens'.", "max_tokens",
                                  "missing_required_parameter"));
  }
  out->common.max_tokens = static_cast<int32_t>(*max_tokens);
  std::optional<bool> stream;
  if (!f.get_bool("stream", &stream)) return false;
  out->common.stream = stream.value_or(false);
  // Anthropic's temperature range is [0, 1].
  return read_core_sampling(f, 1.0, &out->common.sampling) && read_stop_sequences(f, &out->common.stop) &&
         reject_output_format(f);
}

}  // namespace

std::optional<ApiError> parse_messages_request(std::string_view body, const RequestLimits& limits,
                                               MessagesCall call, MessagesRequest* out) {
  RequestJson j;
  if (auto err = parse_json_object(body, &j)) return err;
  FieldReader f(j, "");
  if (!read_model(f, limits, &out->common.model)) return f.error();
  if (call == MessagesCall::kCreate && !read_generation_fields(f, out)) return f.error();
  if (!read_messages(f, &out->prompt) || !read_system(f, &out->prompt) ||
      !read_anthropic_tools(f, &out->prompt) || !read_tool_choice(f, out) ||
      !read_template_kwargs(f, &out->prompt.template_kwargs) || !read_thinking(f, call, out)) {
    return f.error();
  }
  return std::nullopt;
}

}  // namespace pd::server
