#include "puredrive/chat/chat_template.h"

#include <algorithm>
#include <filesystem>

#include "puredrive/util/mapped_file.h"

namespace pd::chat {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

nlohmann::ordered_json special_tokens_from_config(const ojson& config) {
  ojson out = ojson::object();
  if (!config.is_object()) return out;
  auto token_text = [](const ojson& v) -> const std::string* {
    if (v.is_string()) return v.get_ptr<const std::string*>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) {
      return v["content"].get_ptr<const std::string*>();
    }
    return nullptr;
  };
  for (const auto& [key, value] : config.items()) {
    if (key.size() < 6 || key.compare(key.size() - 6, 6, "_token") != 0) continue;
    if (const std::string* text = token_text(value)) out[key] = *text;
  }
  if (config.contains("extra_special_tokens") && config["extra_special_tokens"].is_object()) {
    for (const auto& [key, value] : config["extra_special_tokens"].items()) {
      if (const std::string* text = token_text(value)) out[key] = *text;
    }
  }
  return out;
}

void parse_tool_call_arguments(ojson& messages) {
  if (!messages.is_array()) return;
  for (auto& message : messages) {
    if (!message.is_object() || !message.contains("tool_calls") || !message["tool_calls"].is_array())
      continue;
    for (auto& call : message["tool_calls"]) {
      ojson* fn = call.is_object() && call.contains("function") && call["function"].is_object()
                      ? &call["function"]
                      : &call;
      if (!fn->is_object() || !fn->contains("arguments") || !(*fn)["arguments"].is_string()) continue;
      ojson parsed = ojson::parse((*fn)["arguments"].get<std::string>(), nullptr, false);
      if (!parsed.is_discarded() && parsed.is_object()) (*fn)["arguments"] = std::move(parsed);
    }
  }
}

Expected<ChatTemplate> ChatTemplate::from_source(const std::string& source, ojson special_tokens,
                                                 const std::string& name) {
  return from_named({{"", source}}, std::move(special_tokens), name);
}

Expected<ChatTemplate> ChatTemplate::from_named(const std::vector<std::pair<std::string, std::string>>& named,
                                                ojson special_tokens, const std::string& origin) {
  if (named.empty()) return make_error(ErrorCode::kNotFound, "{}: no chat template", origin);
  ChatTemplate out;
  out.origin_ = origin;
  out.special_tokens_ = special_tokens.is_object() ? std::move(special_tokens) : ojson::object();
  for (const auto& [name, source] : named) {
    const std::string label = name.empty() ? origin : origin + " (template '" + name + "')";
    PD_ASSIGN_OR_RETURN(jinja::Template t, jinja::Template::parse(source, label));
    out.templates_.push_back({name, std::make_shared<const jinja::Template>(std::move(t))});
  }
  return out;
}

Expected<ChatTemplate> ChatTemplate::load(const std::string& model_dir) {
  const fs::path dir(model_dir);
  ojson config = ojson::object();
  const fs::path config_path = dir / "tokenizer_config.json";
  std::error_code ec;
  const bool has_config = fs::exists(config_path, ec);
  if (has_config) {
    PD_ASSIGN_OR_RETURN(std::string text, read_text_file(config_path.string()));
    config = ojson::parse(text, nullptr, false);
    if (config.is_discarded() || !config.is_object()) {
      return make_error(ErrorCode::kCorrupt, "{}: not a JSON object", config_path.string());
    }
  }

  std::vector<std::pair<std::string, std::string>> named;
  std::string origin;
  // chat_template.jinja (+ additional_chat_templates/*.jinja) take precedence over the config entry.
  const fs::path jinja_path = dir / "chat_template.jinja";
  if (fs::exists(jinja_path, ec)) {
    PD_ASSIGN_OR_RETURN(std::string text, read_text_file(jinja_path.string()));
    named.emplace_back("default", std::move(text));
    origin = jinja_path.string();
  }
  const fs::path extra_dir = dir / "additional_chat_templates";
  if (fs::is_directory(extra_dir, ec)) {
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(extra_dir, ec)) {
      if (entry.path().extension() == ".jinja") files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      PD_ASSIGN_OR_RETURN(std::string text, read_text_file(f.string()));
      named.emplace_back(f.stem().string(), std::move(text));
      if (origin.empty()) origin = extra_dir.string();
    }
  }
  if (named.size() == 1 && named[0].first == "default") named[0].first.clear();

  if (named.empty() && config.contains("chat_template")) {
    origin = config_path.string() + ":chat_template";
    const ojson& ct = config["chat_template"];
    if (ct.is_string()) {
      named.emplace_back("", ct.get<std::string>());
    } else if (ct.is_array()) {
      for (const auto& entry : ct) {
        if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
            !entry["name"].is_string() || !entry["template"].is_string()) {
          return make_error(ErrorCode::kCorrupt,
                            "{}: expected a list of {{\"name\", \"template\"}} objects, found {}", origin,
                            entry.dump());
        }
        named.emplace_back(entry["name"].get<std::string>(), entry["template"].get<std::string>());
      }
    } else if (!ct.is_null()) {
      return make_error(ErrorCode::kCorrupt, "{}: expected a string or a list of named templates, found {}",
                        origin, ct.type_name());
    }
  }
  if (named.empty()) {
    return make_error(ErrorCode::kNotFound,
                      "{}: no chat template (neither chat_template.jinja nor a \"chat_template\" entry in "
                      "tokenizer_config.json); pass one with --template",
                      model_dir);
  }
  return from_named(named, special_tokens_from_config(config), origin);
}

std::vector<std::string> ChatTemplate::template_names() const {
  std::vector<std::string> names;
  for (const auto& t : templates_) names.push_back(t.name);
  return names;
}

Expected<const jinja::Template*> ChatTemplate::select(bool has_tools) const {
  if (templates_.size() == 1 && templates_[0].name.empty()) return templates_[0].tmpl.get();
  auto find = [&](std::string_view name) -> const jinja::Template* {
    for (const auto& t : templates_) {
      if (t.name == name) return t.tmpl.get();
    }
    return nullptr;
  };
  if (has_tools) {
    if (const auto* t = find("tool_use")) return t;
  }
  if (const auto* t = find("default")) return t;
  std::vector<std::string> names = template_names();
  std::sort(names.begin(), names.end());
  std::string listed;
  for (const auto& n : names) listed += (listed.empty() ? "'" : ", '") + n + "'";
  return make_error(ErrorCode::kInvalidArgument,
                    "{}: the model has several chat templates and none is named 'default' (available: {})",
                    origin_, listed);
}

Expected<std::string> ChatTemplate::render(const ChatInputs& inputs,
                                           const jinja::RenderOptions& options) const {
  if (!inputs.messages.is_array()) {
    return make_error(ErrorCode::kInvalidArgument, "messages must be a JSON array, got {}",
                      inputs.messages.type_name());
  }
  if (inputs.messages.empty()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "Cannot apply chat template to an empty conversation. Provide at least one message.");
  }
  if (!inputs.tools.is_null()) {
    if (!inputs.tools.is_array()) {
      return make_error(ErrorCode::kInvalidArgument, "tools must be a JSON array of schemas, got {}",
                        inputs.tools.type_name());
    }
    for (size_t i = 0; i < inputs.tools.size(); ++i) {
      if (!inputs.tools[i].is_object()) {
        return make_error(ErrorCode::kInvalidArgument,
                          "tools[{}] must be a JSON object (a JSON schema), got {}", i,
                          inputs.tools[i].type_name());
      }
    }
  }
  if (!inputs.extra.is_object()) {
    return make_error(ErrorCode::kInvalidArgument, "template kwargs must be a JSON object, got {}",
                      inputs.extra.type_name());
  }
  PD_ASSIGN_OR_RETURN(const jinja::Template* tmpl, select(!inputs.tools.is_null()));

  // {**special_tokens_map, **kwargs}, then render(messages=, tools=, documents=, add_generation_prompt=,
  // **that).
  jinja::Dict context;
  for (const auto& [k, v] : special_tokens_.items()) {
    PD_ASSIGN_OR_RETURN(jinja::Value value, jinja::value_from_json(v));
    context.set(k, std::move(value));
  }
  for (const auto& [k, v] : inputs.extra.items()) {
    if (k == "messages" || k == "tools" || k == "documents" || k == "add_generation_prompt") {
      return make_error(ErrorCode::kInvalidArgument,
                        "template kwarg '{}' clashes with the argument of the same name", k);
    }
    PD_ASSIGN_OR_RETURN(jinja::Value value, jinja::value_from_json(v));
    context.set(k, std::move(value));
  }
  PD_ASSIGN_OR_RETURN(jinja::Value messages, jinja::value_from_json(inputs.messages));
  PD_ASSIGN_OR_RETURN(jinja::Value tools, jinja::value_from_json(inputs.tools));
  context.set("messages", std::move(messages));
  context.set("tools", std::move(tools));
  context.set("documents", jinja::Value::none());
  context.set("add_generation_prompt", jinja::Value::from_bool(inputs.add_generation_prompt));
  return tmpl->render(context, options);
}

}  // namespace pd::chat
