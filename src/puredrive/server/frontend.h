// The text side of a request, behind two small interfaces so that the HTTP layer does not depend on how
// the tokenizer, the chat template and the output parsers are built:
//  - PromptBuilder renders OpenAI chat messages with the model's chat template and tokenizes them;
//  - OutputParser splits generated text into reasoning, content and tool calls.
// Implementations: the fakes in testing/fake_frontend.h (tests, `serve --fake-engine`) and the model's own
// (tokenizer/ + chat/) in model_frontend.h.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "puredrive/util/status.h"

namespace pd::server {

struct ToolCall {
  std::string id;  // "call_..."
  std::string name;
  std::string arguments;  // JSON text, as OpenAI sends and expects it
};

// One validated chat message. Text content parts are already joined.
struct ChatMessage {
  std::string role;  // system | user | assistant | tool ("developer" arrives as system)
  std::string content;
  bool content_is_null = false;   // assistant messages that only call tools
  std::string reasoning_content;  // assistant: earlier reasoning, when the client sends it back
  std::vector<ToolCall> tool_calls;
  std::string tool_call_id;  // tool
  std::string name;          // optional participant / tool name
};

struct ToolChoice {
  enum class Mode { kAuto, kNone, kRequired, kFunction };
  Mode mode = Mode::kAuto;
  std::string function_name;  // kFunction
};

struct ChatPrompt {
  std::vector<ChatMessage> messages;
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();  // OpenAI "tools" entries, validated
  ToolChoice tool_choice;
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();  // chat_template_kwargs
};

struct PromptTokens {
  std::vector<int32_t> ids;
  // Text that the prompt already opened inside the assistant turn, e.g. the tool-call opening forced for
  // tool_choice required / a named function. The turn parser sees assistant_prefix + generated text, so it
  // parses the turn as a whole.
  std::string assistant_prefix;
  bool starts_in_reasoning = false;  // the prompt ends inside an open <think> block
};

class PromptBuilder {
 public:
  virtual ~PromptBuilder() = default;
  // Applies the chat template with add_generation_prompt. tool_choice: kNone renders no tools; kRequired
  // and kFunction append the model's tool-call opening markup (for kFunction up to the function's name)
  // to the prompt, which steers the model into that call. Template errors are kInvalidArgument.
  virtual Expected<PromptTokens> render_chat(const ChatPrompt& prompt) const = 0;
  // Plain text for /v1/completions: tokenized as is (special tokens in the text are recognised).
  virtual Expected<PromptTokens> tokenize(std::string_view text) const = 0;
  // For token-id prompts of /v1/completions (echo) and for logprob token strings.
  virtual std::string detokenize(std::span<const int32_t> ids) const = 0;
  // End-of-turn / end-of-text ids that end a generation.
  virtual std::vector<int32_t> stop_token_ids() const = 0;
  virtual int32_t vocab_size() const = 0;
  // Bytes of the longest token, added tokens included; 0 when unknown. It bounds how few tokens a text can
  // become, so that a prompt that cannot fit the context is refused before it is tokenized.
  virtual size_t max_token_bytes() const { return 0; }
};

struct ParsedToolCall {
  std::string name;       // empty while not yet known in a partial parse
  std::string arguments;  // JSON text; in a partial parse a prefix of the final arguments
};

struct ParsedOutput {
  std::string reasoning_content;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
};

struct ParseOptions {
  bool tools = false;  // the request offered tools (and tool_choice was not none): look for tool calls
  nlohmann::ordered_json tools_json =
      nlohmann::ordered_json::array();  // the request's tools (typing XML arguments)
};

// Parses one assistant turn while it is generated. The parse only grows: every field of a later result
// starts with the same field of an earlier one (tool calls keep their index; a call's name is set once
// and its arguments only grow), and markup that may be the start of a tag is held back rather than shown
// as content. The streaming delta builder (chat_delta.h) relies on that.
class TurnParser {
 public:
  virtual ~TurnParser() = default;
  // Adds generated text; returns the turn as parsed so far.
  virtual const ParsedOutput& feed(std::string_view delta) = 0;
  // End of generation: releases held-back text; returns the final parse.
  virtual const ParsedOutput& finish() = 0;
};

class OutputParser {
 public:
  virtual ~OutputParser() = default;
  // A parser for one turn that starts after `prompt` (its assistant_prefix and whether the prompt left a
  // reasoning block open).
  virtual std::unique_ptr<TurnParser> start_turn(const ParseOptions& options,
                                                 const PromptTokens& prompt) const = 0;
};

struct Frontend {
  std::shared_ptr<const PromptBuilder> prompts;
  std::shared_ptr<const OutputParser> parser;
};

}  // namespace pd::server
