#include "puredrive/server/chat_request.h"

#include <set>

#include <fmt/format.h>

namespace pd::server {
namespace {

// Content: a string, or an array of parts of which only text parts are accepted (text-only model).
bool read_content(FieldReader& f, const RequestJson& message, const std::string& path, ChatMessage* m) {
  auto it = message.find("content");
  if (it == message.end() || it->is_null()) {
    m->content_is_null = true;
    return true;
  }
  if (it->is_string()) {
    m->content = it->get<std::string>();
    return true;
  }
  if (!it->is_array()) return f.type_error("content", "a string or an array of content parts");
  std::string joined;
  for (size_t i = 0; i < it->size(); ++i) {
    const RequestJson& part = (*it)[i];
    const std::string part_path = param_index(param_name(path, "content"), i);
    if (!part.is_object()) {
      return f.fail(invalid_request(fmt::format("Invalid type for '{}': expected an object.", part_path),
                                    part_path, "invalid_type"));
    }
    FieldReader pf(part, part_path);
    std::string type;
    if (!pf.require_string("type", &type)) return f.fail(*pf.error());
    if (type == "text") {
      std::string text;
      if (!pf.require_string("text", &text)) return f.fail(*pf.error());
      // Parts are concatenated as sent (the Qwen templates do the same with a list of parts).
      joined += text;
    } else if (type == "image_url" || type == "input_image" || type == "image" || type == "input_audio" ||
               type == "audio" || type == "file" || type == "video_url") {
      return f.fail(invalid_request(
          fmt::format(
              "Content part type '{}' in '{}' is not supported: this server runs a text-only model. Send "
              "text parts only.",
              echo(type), part_path),
          param_name(part_path, "type"), "unsupported_content_type"));
    } else {
      return f.fail(invalid_request(
          fmt::format("Invalid value for '{}': unknown content part type '{}'; expected 'text'.",
                      param_name(part_path, "type"), echo(type)),
          param_name(part_path, "type"), "invalid_value"));
    }
  }
  m->content = std::move(joined);
  return true;
}

bool read_tool_calls(FieldReader& f, const RequestJson& calls, const std::string& path, ChatMessage* m) {
  if (!calls.is_array()) return f.type_error("tool_calls", "an array");
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string call_path = param_index(path, i);
    if (!calls[i].is_object()) {
      return f.fail(invalid_request(fmt::format("Invalid type for '{}': expected an object.", call_path),
                                    call_path, "invalid_type"));
    }
    FieldReader cf(calls[i], call_path);
    ToolCall call;
    std::optional<std::string> id, type;
    if (!cf.get_string("id", &id) || !cf.get_string("type", &type)) return f.fail(*cf.error());
    if (type && *type != "function") {
      return f.fail(
          invalid_request(fmt::format("Invalid value for '{}': only 'function' tool calls are supported.",
                                      param_name(call_path, "type")),
                          param_name(call_path, "type"), "invalid_value"));
    }
    const RequestJson* fn = cf.find("function");
    if (!fn) {
      return f.fail(
          invalid_request(fmt::format("Missing required parameter: '{}'.", param_name(call_path, "function")),
                          param_name(call_path, "function"), "missing_required_parameter"));
    }
    if (!fn->is_object()) {
      cf.type_error("function", "an object");
      return f.fail(*cf.error());
    }
    FieldReader ff(*fn, param_name(call_path, "function"));
    if (!ff.require_string("name", &call.name)) return f.fail(*ff.error());
    const RequestJson* args = ff.find("arguments");
    if (!args) {
      call.arguments = "{}";
    } else if (args->is_string()) {
      call.arguments = args->get<std::string>();
    } else if (args->is_object()) {
      call.arguments = args->dump();  // lenient: some clients send the object itself
    } else {
      ff.type_error("arguments", "a JSON string");
      return f.fail(*ff.error());
    }
    call.id = id.value_or("");
    m->tool_calls.push_back(std::move(call));
  }
  return true;
}

bool read_message(FieldReader& top, const RequestJson& message, size_t index, ChatMessage* m) {
  const std::string path = param_index("messages", index);
  if (!message.is_object()) {
    return top.fail(invalid_request(fmt::format("Invalid type for '{}': expected an object.", path), path,
                                    "invalid_type"));
  }
  FieldReader f(message, path);
  if (!f.require_string("role", &m->role)) return top.fail(*f.error());
  if (m->role == "developer") m->role = "system";
  if (m->role != "system" && m->role != "user" && m->role != "assistant" && m->role != "tool") {
    f.fail(invalid_request(
        fmt::format(
            "Invalid value for '{}': '{}' is not a supported role; expected one of 'system', 'developer', "
            "'user', 'assistant', 'tool'.",
            param_name(path, "role"), echo(m->role)),
        param_name(path, "role"), "invalid_value"));
    return top.fail(*f.error());
  }
  if (!read_content(f, message, path, m)) return top.fail(*f.error());
  std::optional<std::string> name, reasoning;
  if (!f.get_string("name", &name) || !f.get_string("reasoning_content", &reasoning))
    return top.fail(*f.error());
  m->name = name.value_or("");
  m->reasoning_content = reasoning.value_or("");
  if (m->role == "assistant") {
    if (const RequestJson* calls = f.find("tool_calls")) {
      if (!read_tool_calls(f, *calls, param_name(path, "tool_calls"), m)) return top.fail(*f.error());
    }
  } else if (m->content_is_null) {
    return top.fail(invalid_request(
        fmt::format("Missing required parameter: '{}' (only assistant messages may omit content).",
                    param_name(path, "content")),
        param_name(path, "content"), "missing_required_parameter"));
  }
  if (m->role == "tool") {
    if (!f.require_string("tool_call_id", &m->tool_call_id)) return top.fail(*f.error());
  }
  return true;
}

bool read_tools(FieldReader& f, ChatPrompt* prompt) {
  const RequestJson* tools = f.find("tools");
  if (!tools) return true;
  if (!tools->is_array()) return f.type_error("tools", "an array");
  std::set<std::string> names;
  for (size_t i = 0; i < tools->size(); ++i) {
    const RequestJson& tool = (*tools)[i];
    const std::string path = param_index("tools", i);
    if (!tool.is_object()) {
      return f.fail(invalid_request(fmt::format("Invalid type for '{}': expected an object.", path), path,
                                    "invalid_type"));
    }
    FieldReader tf(tool, path);
    std::string type;
    if (!tf.require_string("type", &type)) return f.fail(*tf.error());
    if (type != "function") {
      return f.fail(invalid_request(
          fmt::format("Invalid value for '{}': '{}' tools are not supported; expected 'function'.",
                      param_name(path, "type"), echo(type)),
          param_name(path, "type"), "invalid_value"));
    }
    const RequestJson* fn = tf.find("function");
    if (!fn || !fn->is_object()) {
      return f.fail(
          invalid_request(fmt::format("'{}' must be an object with the function's name and parameters.",
                                      param_name(path, "function")),
                          param_name(path, "function"), fn ? "invalid_type" : "missing_required_parameter"));
    }
    FieldReader ff(*fn, param_name(path, "function"));
    std::string name;
    std::optional<std::string> description;
    std::optional<bool> strict;
    if (!ff.require_string("name", &name) || !ff.get_string("description", &description) ||
        !ff.get_bool("strict", &strict)) {
      return f.fail(*ff.error());
    }
    if (!is_valid_function_name(name)) {
      return f.fail(invalid_request(
          fmt::format("Invalid value for '{}': '{}' does not match '^[a-zA-Z0-9_-]{{1,64}}$'.",
                      ff.name("name"), echo(name)),
          ff.name("name"), "invalid_value"));
    }
    if (!names.insert(name).second) {
      return f.fail(invalid_request(fmt::format("Duplicate tool name '{}' in '{}'.", echo(name), path),
                                    ff.name("name"), "invalid_value"));
    }
    if (const RequestJson* params = ff.find("parameters"); params && !params->is_object()) {
      ff.type_error("parameters", "a JSON Schema object");
      return f.fail(*ff.error());
    }
    prompt->tools.push_back(tool);
  }
  return true;
}

bool read_tool_choice(FieldReader& f, ChatPrompt* prompt) {
  const RequestJson* choice = f.find("tool_choice");
  if (!choice) return true;
  ToolChoice& tc = prompt->tool_choice;
  if (choice->is_string()) {
    const std::string s = choice->get<std::string>();
    if (s == "auto") {
      tc.mode = ToolChoice::Mode::kAuto;
    } else if (s == "none") {
      tc.mode = ToolChoice::Mode::kNone;
    } else if (s == "required") {
      tc.mode = ToolChoice::Mode::kRequired;
    } else {
      return f.value_error("tool_choice",
                           fmt::format("expected 'none', 'auto', 'required' or an object naming a "
                                       "function, but got '{}'.",
                                       echo(s)));
    }
  } else if (choice->is_object()) {
    FieldReader cf(*choice, "tool_choice");
    std::string type;
    if (!cf.require_string("type", &type)) return f.fail(*cf.error());
    const RequestJson* fn = cf.find("function");
    if (type != "function" || !fn || !fn->is_object()) {
      return f.value_error("tool_choice",
                           "expected {\"type\": \"function\", \"function\": {\"name\": ...}}.");
    }
    FieldReader ff(*fn, "tool_choice.function");
    if (!ff.require_string("name", &tc.function_name)) return f.fail(*ff.error());
    tc.mode = ToolChoice::Mode::kFunction;
  } else {
    return f.type_error("tool_choice", "a string or an object");
  }
  const bool needs_tools = tc.mode == ToolChoice::Mode::kRequired || tc.mode == ToolChoice::Mode::kFunction;
  if (needs_tools && prompt->tools.empty()) {
    return f.fail(invalid_request("'tool_choice' requires 'tools': send the tools the model may call.",
                                  "tool_choice", "invalid_value"));
  }
  if (tc.mode == ToolChoice::Mode::kFunction) {
    bool found = false;
    for (const auto& t : prompt->tools) found = found || t["function"]["name"] == tc.function_name;
    if (!found) {
      return f.value_error("tool_choice", fmt::format("function '{}' is not among the request's tools.",
                                                      echo(tc.function_name)));
    }
  }
  return true;
}

// Fields OpenAI defines that would change the output: refusing them is honest, ignoring them is not.
bool reject_unsupported(FieldReader& f) {
  if (const RequestJson* rf = f.find("response_format")) {
    if (!rf->is_object()) return f.type_error("response_format", "an object");
    FieldReader rff(*rf, "response_format");
    std::string type;
    if (!rff.require_string("type", &type)) return f.fail(*rff.error());
    if (type != "text") {
      return f.fail(invalid_request(
          fmt::format(
              "response_format type '{}' is not supported (no constrained decoding); use 'text' and ask "
              "for JSON in the prompt.",
              echo(type)),
          "response_format", "unsupported_value"));
    }
  }
  if (f.has("functions") || f.has("function_call")) {
    return f.fail(
        invalid_request("'functions' and 'function_call' are deprecated and not supported; use 'tools' "
                        "and 'tool_choice'.",
                        f.has("functions") ? "functions" : "function_call", "unsupported_parameter"));
  }
  if (f.has("audio")) {
    return f.fail(invalid_request("Audio output is not supported by this text-only server.", "audio",
                                  "unsupported_parameter"));
  }
  if (const RequestJson* mod = f.find("modalities")) {
    if (!mod->is_array()) return f.type_error("modalities", "an array of strings");
    for (const auto& m : *mod) {
      if (m != "text") {
        return f.fail(
            invalid_request("Only the 'text' modality is supported.", "modalities", "unsupported_value"));
      }
    }
  }
  return true;
}

}  // namespace

ParseOptions parse_options(const ChatPrompt& prompt) {
  ParseOptions o;
  o.tools = !prompt.tools.empty() && prompt.tool_choice.mode != ToolChoice::Mode::kNone;
  if (o.tools) o.tools_json = prompt.tools;
  return o;
}

ParsedOutput limit_calls(bool parallel_tool_calls, ParsedOutput parsed) {
  if (!parallel_tool_calls && parsed.tool_calls.size() > 1) parsed.tool_calls.resize(1);
  return parsed;
}

std::optional<ApiError> parse_chat_request(std::string_view body, const RequestLimits& limits,
                                           ChatRequest* out) {
  RequestJson j;
  if (auto err = parse_json_object(body, &j)) return err;
  FieldReader f(j, "");
  if (!read_common_fields(f, limits, &out->common) || !reject_unsupported(f)) return f.error();

  const RequestJson* messages = f.find("messages");
  if (!messages) {
    return invalid_request("Missing required parameter: 'messages'.", "messages",
                           "missing_required_parameter");
  }
  if (!messages->is_array()) {
    f.type_error("messages", "an array");
    return f.error();
  }
  if (messages->empty()) {
    return invalid_request(
        "Invalid value for 'messages': expected an array with at least one message, but got an "
        "empty array.",
        "messages", "empty_array");
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    ChatMessage m;
    if (!read_message(f, (*messages)[i], i, &m)) return f.error();
    out->prompt.messages.push_back(std::move(m));
  }
  if (!read_tools(f, &out->prompt) || !read_tool_choice(f, &out->prompt)) return f.error();

  std::optional<bool> logprobs, parallel;
  std::optional<int64_t> top_logprobs;
  if (!f.get_bool("logprobs", &logprobs) || !f.get_int("top_logprobs", 0, 20, &top_logprobs) ||
      !f.get_bool("parallel_tool_calls", &parallel)) {
    return f.error();
  }
  out->logprobs = logprobs.value_or(false);
  if (top_logprobs && !out->logprobs) {
    return invalid_request("'top_logprobs' requires 'logprobs' to be true.", "top_logprobs", "invalid_value");
  }
  out->top_logprobs = static_cast<int32_t>(top_logprobs.value_or(0));
  out->parallel_tool_calls = parallel.value_or(true);

  if (!read_template_kwargs(f, &out->prompt.template_kwargs)) return f.error();
  return std::nullopt;
}

}  // namespace pd::server
