// Chat prompts as transformers' tokenizer.apply_chat_template(..., tokenize=False) renders them.
//
// Template selection (transformers 5.x PreTrainedTokenizerBase.get_chat_template): a model directory has one
// template (tokenizer_config.json "chat_template" string, or chat_template.jinja) or several named ones
// (a [{name, template}] list in tokenizer_config.json, or chat_template.jinja as "default" plus
// additional_chat_templates/NAME.jinja). With several, "tool_use" is used when tools are given, else
// "default". Files override tokenizer_config.json, as in transformers.
//
// The template sees: the special tokens (bos_token, eos_token, ... and every other "*_token" string of
// tokenizer_config.json), then the extra kwargs (enable_thinking, ...), then messages, tools (None when
// absent), documents (None) and add_generation_prompt. Messages are passed through unchanged: in
// particular assistant tool_calls[].function.arguments stays a JSON string if it is one (templates like
// Qwen3.5 need an object; see parse_tool_call_arguments).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "puredrive/chat/jinja/template.h"
#include "puredrive/util/status.h"

namespace pd::chat {

struct ChatInputs {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null: no tools; else an array of JSON schemas
  bool add_generation_prompt = false;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // more template variables
};

class ChatTemplate {
 public:
  // Reads tokenizer_config.json / chat_template.jinja / additional_chat_templates/ of a model directory.
  static Expected<ChatTemplate> load(const std::string& model_dir);
  // A single template; `special_tokens` maps names (bos_token, ...) to strings.
  static Expected<ChatTemplate> from_source(
      const std::string& source, nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object(),
      const std::string& name = "chat_template");
  // Several named templates (selection as described above).
  static Expected<ChatTemplate> from_named(const std::vector<std::pair<std::string, std::string>>& named,
                                           nlohmann::ordered_json special_tokens, const std::string& origin);

  Expected<std::string> render(const ChatInputs& inputs, const jinja::RenderOptions& options = {}) const;

  // The template apply_chat_template would use, with or without tools.
  Expected<const jinja::Template*> select(bool has_tools) const;
  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }
  std::vector<std::string> template_names() const;

 private:
  struct Named {
    std::string name;  // empty for a single unnamed template
    std::shared_ptr<const jinja::Template> tmpl;
  };
  std::vector<Named> templates_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
  std::string origin_;
};

// The special tokens apply_chat_template passes to the template, read from a parsed tokenizer_config.json:
// "*_token" keys with a string value or an AddedToken object ({"content": ...}), plus extra_special_tokens
// when it is a dict. Null values are skipped.
nlohmann::ordered_json special_tokens_from_config(const nlohmann::ordered_json& tokenizer_config);

// OpenAI clients send tool_calls[].function.arguments as a JSON string; many templates (Qwen3.5,
// Qwen3-Coder, GLM) iterate it as an object. Replaces string arguments that parse as a JSON object by the
// object, in place (what vLLM does before templating). Other values are left alone.
void parse_tool_call_arguments(nlohmann::ordered_json& messages);

}  // namespace pd::chat
