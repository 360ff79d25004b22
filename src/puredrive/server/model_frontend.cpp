#include "puredrive/server/model_frontend.h"

#include <algorithm>

#include "puredrive/chat/output_parser.h"

namespace pd::server {
namespace {

using OJson = nlohmann::ordered_json;

ToolMarkup detect_markup(const Tokenizer& tokenizer) {
  ToolMarkup found = ToolMarkup::kNone;
  for (const auto& [name, source] : tokenizer.chat_templates()) {
    if (source.find("<function=") != std::string::npos) return ToolMarkup::kXml;
    if (source.find("<tool_call>") != std::string::npos) found = ToolMarkup::kJson;
  }
  return found;
}

class ChatTurnParser final : public TurnParser {
 public:
  ChatTurnParser(chat::OutputParserOptions options, std::string prefix)
      : parser_(std::move(options)), prefix_(std::move(prefix)) {}

  const ParsedOutput& feed(std::string_view delta) override {
    feed_prefix();
    parser_.feed(delta);
    return convert(parser_.message());
  }
  const ParsedOutput& finish() override {
    feed_prefix();
    return convert(parser_.finish());
  }

 private:
  void feed_prefix() {
    if (prefix_fed_) return;
    prefix_fed_ = true;
    if (!prefix_.empty()) parser_.feed(prefix_);
  }
  const ParsedOutput& convert(const chat::ParsedMessage& m) {
    parsed_.content = m.content;
    parsed_.reasoning_content = m.reasoning_content;
    parsed_.tool_calls.clear();
    for (const auto& c : m.tool_calls) parsed_.tool_calls.push_back(ParsedToolCall{c.name, c.arguments});
    return parsed_;
  }

  chat::OutputParser parser_;
  std::string prefix_;
  bool prefix_fed_ = false;
  ParsedOutput parsed_;
};

}  // namespace

OJson template_messages(const ChatPrompt& prompt) {
  OJson messages = OJson::array();
  for (const ChatMessage& m : prompt.messages) {
    OJson j = {{"role", m.role}};
    j["content"] = m.content_is_null ? OJson(nullptr) : OJson(m.content);
    if (!m.name.empty()) j["name"] = m.name;
    if (!m.reasoning_content.empty()) j["reasoning_content"] = m.reasoning_content;
    if (!m.tool_calls.empty()) {
      OJson calls = OJson::array();
      for (const ToolCall& c : m.tool_calls) {
        calls.push_back({{"id", c.id},
                         {"type", "function"},
                         {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      }
      j["tool_calls"] = std::move(calls);
    }
    if (m.role == "tool") j["tool_call_id"] = m.tool_call_id;
    messages.push_back(std::move(j));
  }
  chat::parse_tool_call_arguments(messages);
  return messages;
}

Expected<std::shared_ptr<ModelPromptBuilder>> ModelPromptBuilder::load(const std::string& model_dir,
                                                                       Tokenizer tokenizer,
                                                                       std::vector<int32_t> stop_ids,
                                                                       int32_t vocab_limit) {
  PD_ASSIGN_OR_RETURN(chat::ChatTemplate tmpl, chat::ChatTemplate::load(model_dir));
  std::shared_ptr<ModelPromptBuilder> b(new ModelPromptBuilder(std::move(tokenizer), std::move(tmpl)));
  b->stop_ids_ = std::move(stop_ids);
  if (b->stop_ids_.empty()) {
    return make_error(
        ErrorCode::kInvalidArgument,
        "{}: no end-of-sequence token (generation_config.json eos_token_id, config.json eos_token_id or "
        "tokenizer_config.json eos_token); generation could not stop",
        model_dir);
  }
  b->vocab_size_ =
      vocab_limit > 0 ? std::min(vocab_limit, b->tokenizer_.id_limit()) : b->tokenizer_.id_limit();
  b->markup_ = detect_markup(b->tokenizer_);
  for (int32_t id = 0; id < b->tokenizer_.id_limit(); ++id) {
    b->max_token_bytes_ = std::max(b->max_token_bytes_, b->tokenizer_.token_bytes(id).size());
  }
  return b;
}

Expected<PromptTokens> ModelPromptBuilder::render_chat(const ChatPrompt& prompt) const {
  const bool tools = !prompt.tools.empty() && prompt.tool_choice.mode != ToolChoice::Mode::kNone;
  chat::ChatInputs inputs;
  inputs.messages = template_messages(prompt);
  inputs.tools = tools ? prompt.tools : OJson(nullptr);
  inputs.add_generation_prompt = true;
  inputs.extra = prompt.template_kwargs;
  PD_ASSIGN_OR_RETURN(std::string text, template_.render(inputs));

  PromptTokens out;
  const auto mode = prompt.tool_choice.mode;
  if (tools && (mode == ToolChoice::Mode::kRequired || mode == ToolChoice::Mode::kFunction)) {
    if (markup_ == ToolMarkup::kNone) {
      return make_error(
          ErrorCode::kUnsupported,
          "tool_choice '{}' cannot be honoured: this model's chat template has no tool-call markup to "
          "steer the model with; use tool_choice 'auto'",
          mode == ToolChoice::Mode::kRequired ? "required" : prompt.tool_choice.function_name);
    }
    if (chat::prompt_opens_reasoning(text)) text += "\n</think>\n\n";
    out.assistant_prefix = "<tool_call>\n";
    if (mode == ToolChoice::Mode::kFunction) {
      const std::string& name = prompt.tool_choice.function_name;
      out.assistant_prefix += markup_ == ToolMarkup::kXml ? "<function=" + name + ">\n"
                                                          : "{\"name\": \"" + name + "\", \"arguments\": ";
    }
    text += out.assistant_prefix;
  }
  out.starts_in_reasoning = out.assistant_prefix.empty() && chat::prompt_opens_reasoning(text);
  PD_ASSIGN_OR_RETURN(out.ids, tokenizer_.encode(text, /*add_special_tokens=*/false));
  return out;
}

Expected<PromptTokens> ModelPromptBuilder::tokenize(std::string_view text) const {
  PromptTokens out;
  PD_ASSIGN_OR_RETURN(out.ids, tokenizer_.encode(text, /*add_special_tokens=*/true));
  return out;
}

std::unique_ptr<TurnParser> ModelOutputParser::start_turn(const ParseOptions& options,
                                                          const PromptTokens& prompt) const {
  chat::OutputParserOptions o;
  o.parse_reasoning = true;
  o.starts_in_reasoning = prompt.starts_in_reasoning;
  o.parse_tool_calls = options.tools;
  if (options.tools) o.tools = options.tools_json;
  return std::make_unique<ChatTurnParser>(std::move(o), prompt.assistant_prefix);
}

Expected<Frontend> load_model_frontend(const std::string& model_dir, Tokenizer tokenizer,
                                       std::vector<int32_t> stop_ids, int32_t vocab_limit) {
  PD_ASSIGN_OR_RETURN(auto prompts, ModelPromptBuilder::load(model_dir, std::move(tokenizer),
                                                             std::move(stop_ids), vocab_limit));
  return Frontend{std::move(prompts), std::make_shared<ModelOutputParser>()};
}

}  // namespace pd::server
