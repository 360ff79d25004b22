// Incremental parser of generated text into content, reasoning_content and tool calls (the OpenAI chat
// message fields), for the Qwen family's markup:
//   <think> ... </think>            reasoning; the prompt may already have opened it (Qwen3.5 adds
//   "<think>\n"
//                                   to the generation prompt), then the output starts inside reasoning
//   <tool_call> ... </tool_call>    a tool call, XML (<function=NAME><parameter=ARG>...) or JSON
//                                   ({"name": ..., "arguments": ...}) inside; see tool_call_format.h.
//                                   A call written inside the reasoning is a call too (models do that, and
//                                   often never close the reasoning); the reasoning resumes after it
//
// feed() takes text deltas as the detokenizer produces them; markup may be split at any byte. Text that only
// might be the start of markup is held back until the next delta decides it. A tool call is reported once
// its closing tag arrives (start, arguments, end events together), so a malformed or unterminated block can
// still become plain content: nothing the model wrote is ever dropped, except the whitespace the chat
// templates put around markup (newlines after <think>, before </think>, around tool calls).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "puredrive/chat/tool_call_format.h"

namespace pd::chat {

struct OutputParserOptions {
  bool parse_reasoning = true;       // recognise <think>...</think> at the start of the output
  bool starts_in_reasoning = false;  // the prompt ended inside <think> (see prompt_opens_reasoning)
  bool parse_tool_calls = true;
  // The request's tools: types XML parameter values; when non-empty, calls to other names stay text.
  nlohmann::ordered_json tools;
  // Tool call ids; default "call_<index>".
  std::function<std::string(size_t index)> make_id;
};

enum class ParseEventType { kContent, kReasoning, kToolCallStart, kToolCallArguments, kToolCallEnd };

struct ParseEvent {
  ParseEventType type;
  std::string text;       // content / reasoning delta, or the arguments JSON
  size_t tool_index = 0;  // tool call events
  std::string id;         // kToolCallStart
  std::string name;       // kToolCallStart
};

struct ParsedMessage {
  std::string content;
  std::string reasoning_content;
  std::vector<ToolCall> tool_calls;
};

class OutputParser {
 public:
  explicit OutputParser(OutputParserOptions options = {});

  std::vector<ParseEvent> feed(std::string_view delta);
  // End of generation: flushes held-back text (appended to *events when given) and returns the message.
  ParsedMessage finish(std::vector<ParseEvent>* events = nullptr);
  const ParsedMessage& message() const { return msg_; }

 private:
  enum class State { kStart, kReasoning, kContent, kToolCall };

  void process(bool final, std::vector<ParseEvent>& out);
  void emit_reasoning(std::string_view text, std::vector<ParseEvent>& out);
  void emit_content(std::string_view text, std::vector<ParseEvent>& out);
  void add_text_event(ParseEventType type, std::string_view text, std::vector<ParseEvent>& out);
  bool finish_tool_call(std::string_view body, std::vector<ParseEvent>& out);

  OutputParserOptions options_;
  ToolSchemas schemas_;
  State state_;
  std::string buf_;                 // input not yet classified
  size_t scanned_ = 0;              // kToolCall: bytes of buf_ already searched for </tool_call>
  std::string held_newlines_;       // trailing newlines of reasoning, dropped if </think> follows
  std::string held_space_;          // trailing whitespace of content, dropped if a tool call follows
  bool reasoning_at_start_ = true;  // drop newlines right after <think>
  bool content_at_start_ = true;    // drop newlines right after </think> and whitespace after a tool call
  bool call_in_reasoning_ = false;  // kToolCall: the call opened inside the reasoning, which resumes after it
  bool finished_ = false;
  ParsedMessage msg_;
};

// Whether a rendered prompt leaves a <think> block open for the model (Qwen3.5 / DeepSeek thinking mode):
// the last "<think>" comes after the last "</think>".
bool prompt_opens_reasoning(std::string_view prompt);

}  // namespace pd::chat
