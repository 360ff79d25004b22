// The model's own frontend: tokenizer/ (tokenizer.json), chat/ (the model's Jinja chat template, the Qwen
// reasoning / tool-call output parser) and the end-of-sequence ids the caller read (the CLI uses
// decode/model_defaults.h; the server library does not depend on decode/).
//
// Forced tool choice (tool_choice "required" or a named function): the rendered prompt gets the opening of
// a tool call appended, in the markup the template itself uses for assistant tool calls:
//   XML templates (Qwen3.5, Qwen3-Coder: "<function=" in the template):
//       required: "<tool_call>\n"           named: "<tool_call>\n<function=NAME>\n"
//   JSON templates (Qwen2.5/Qwen3, Hermes):
//       required: "<tool_call>\n"           named: "<tool_call>\n{\"name\": \"NAME\", \"arguments\": "
// If the generation prompt left a <think> block open, it is closed first ("\n</think>\n\n", the
// thinking-off rendering). The model then continues inside the call; the output parser sees the opening
// as the start of the turn. A template without tool-call markup cannot be steered: the request is refused.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "puredrive/chat/chat_template.h"
#include "puredrive/server/frontend.h"
#include "puredrive/tokenizer/tokenizer.h"

namespace pd::server {

enum class ToolMarkup { kNone, kXml, kJson };

class ModelPromptBuilder final : public PromptBuilder {
 public:
  // The chat template comes from model_dir. stop_ids: the model's end-of-sequence ids; an empty list is
  // refused (generation could not stop). vocab_limit: the model's vocabulary size (ids a request may name
  // are below min(it, tokenizer's)).
  static Expected<std::shared_ptr<ModelPromptBuilder>> load(const std::string& model_dir, Tokenizer tokenizer,
                                                            std::vector<int32_t> stop_ids,
                                                            int32_t vocab_limit);

  Expected<PromptTokens> render_chat(const ChatPrompt& prompt) const override;
  Expected<PromptTokens> tokenize(std::string_view text) const override;
  std::string detokenize(std::span<const int32_t> ids) const override { return tokenizer_.decode(ids); }
  std::vector<int32_t> stop_token_ids() const override { return stop_ids_; }
  int32_t vocab_size() const override { return vocab_size_; }
  size_t max_token_bytes() const override { return max_token_bytes_; }

  const Tokenizer& tokenizer() const { return tokenizer_; }
  ToolMarkup tool_markup() const { return markup_; }

 private:
  ModelPromptBuilder(Tokenizer tokenizer, chat::ChatTemplate tmpl)
      : tokenizer_(std::move(tokenizer)), template_(std::move(tmpl)) {}

  Tokenizer tokenizer_;
  chat::ChatTemplate template_;
  std::vector<int32_t> stop_ids_;
  int32_t vocab_size_ = 0;
  size_t max_token_bytes_ = 0;
  ToolMarkup markup_ = ToolMarkup::kNone;
};

class ModelOutputParser final : public OutputParser {
 public:
  std::unique_ptr<TurnParser> start_turn(const ParseOptions& options,
                                         const PromptTokens& prompt) const override;
};

// The OpenAI messages of a chat prompt as the chat template expects them (tool-call arguments as objects).
nlohmann::ordered_json template_messages(const ChatPrompt& prompt);

Expected<Frontend> load_model_frontend(const std::string& model_dir, Tokenizer tokenizer,
                                       std::vector<int32_t> stop_ids, int32_t vocab_limit);

}  // namespace pd::server
