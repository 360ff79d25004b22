#include "puredrive/server/testing/fake_frontend.h"

#include <array>

namespace pd::server::fake {
namespace {

constexpr std::array<std::pair<int32_t, std::string_view>, 3> kSpecials{{
    {kImStart, "<|im_start|>"},
    {kImEnd, "<|im_end|>"},
    {kEndOfText, "<|endoftext|>"},
}};

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kArgumentsKey = "\"arguments\": ";

// Length of the longest suffix of text that is a proper prefix of tag (text may still grow into it).
size_t partial_tag_suffix(std::string_view text, std::string_view tag) {
  for (size_t len = std::min(text.size(), tag.size() - 1); len > 0; --len) {
    if (text.substr(text.size() - len) == tag.substr(0, len)) return len;
  }
  return 0;
}

std::string_view trim_newlines(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

// One "<tool_call>" block body. Arguments are the raw JSON text the model wrote after "arguments": ; while
// the block is open, trailing '}' and whitespace are held back because they may close the outer object.
ParsedToolCall parse_call(std::string_view body, bool complete) {
  ParsedToolCall call;
  const size_t name_key = body.find("\"name\": \"");
  if (name_key != std::string_view::npos) {
    const size_t start = name_key + 9;
    const size_t end = body.find('"', start);
    if (end != std::string_view::npos) call.name = std::string(body.substr(start, end - start));
  }
  const size_t args = body.find(kArgumentsKey);
  if (args == std::string_view::npos) return call;
  std::string_view raw = body.substr(args + kArgumentsKey.size());
  if (complete) {
    raw = trim_newlines(raw);
    if (!raw.empty() && raw.back() == '}') raw.remove_suffix(1);  // the outer object's brace
  } else {
    while (!raw.empty() && (raw.back() == '}' || raw.back() == ' ' || raw.back() == '\n'))
      raw.remove_suffix(1);
  }
  call.arguments = std::string(raw);
  return call;
}

struct TextOptions {
  bool tools = false;
  bool partial = false;
};

void parse_content(std::string_view text, const TextOptions& options, ParsedOutput* out) {
  if (!options.tools) {
    out->content = std::string(text);
    return;
  }
  size_t open = text.find(kCallOpen);
  if (open == std::string_view::npos) {
    const size_t hold = options.partial ? partial_tag_suffix(text, kCallOpen) : 0;
    out->content = std::string(text.substr(0, text.size() - hold));
    return;
  }
  out->content = std::string(text.substr(0, open));
  while (open != std::string_view::npos) {
    const size_t body_start = open + kCallOpen.size();
    const size_t close = text.find(kCallClose, body_start);
    const bool complete = close != std::string_view::npos;
    std::string_view body = text.substr(body_start, complete ? close - body_start : std::string_view::npos);
    if (!complete && options.partial) body.remove_suffix(partial_tag_suffix(body, kCallClose));
    out->tool_calls.push_back(parse_call(body, complete || !options.partial));
    if (!complete) break;
    open = text.find(kCallOpen, close + kCallClose.size());
  }
}

}  // namespace

std::vector<int32_t> encode(std::string_view text) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    bool special = false;
    for (const auto& [id, s] : kSpecials) {
      if (text.substr(i, s.size()) == s) {
        ids.push_back(id);
        i += s.size();
        special = true;
        break;
      }
    }
    if (!special) ids.push_back(static_cast<unsigned char>(text[i++]));
  }
  return ids;
}

std::string decode(std::span<const int32_t> ids) {
  std::string text;
  for (int32_t id : ids) {
    if (id >= 0 && id < 256) {
      text += static_cast<char>(id);
    } else {
      for (const auto& [sid, s] : kSpecials) {
        if (sid == id) text += s;
      }
    }
  }
  return text;
}

Expected<PromptTokens> FakePromptBuilder::render_chat(const ChatPrompt& prompt) const {
  bool has_user = false;
  for (const auto& m : prompt.messages) has_user = has_user || m.role == "user";
  if (!has_user) return make_error(ErrorCode::kInvalidArgument, "chat template error: no user message found");

  const bool tools = !prompt.tools.empty() && prompt.tool_choice.mode != ToolChoice::Mode::kNone;
  std::string text;
  size_t first = 0;
  if (tools) {
    text += "<|im_start|>system\n";
    if (prompt.messages[0].role == "system") {
      text += prompt.messages[0].content + "\n\n";
      first = 1;
    }
    text += "# Tools\n<tools>\n";
    for (const auto& t : prompt.tools) text += t.dump() + "\n";
    text +=
        "</tools>\nCall a tool with <tool_call>\n{\"name\": ..., \"arguments\": "
        "...}\n</tool_call><|im_end|>\n";
  }
  for (size_t i = first; i < prompt.messages.size(); ++i) {
    const ChatMessage& m = prompt.messages[i];
    text += "<|im_start|>" + m.role + "\n";
    if (m.role == "tool") {
      text += "<tool_response>\n" + m.content + "\n</tool_response>";
    } else {
      if (!m.reasoning_content.empty()) text += "<think>\n" + m.reasoning_content + "\n</think>\n\n";
      text += m.content;
      for (const auto& c : m.tool_calls) {
        text +=
            "<tool_call>\n{\"name\": \"" + c.name + "\", \"arguments\": " + c.arguments + "}\n</tool_call>";
      }
    }
    text += "<|im_end|>\n";
  }
  text += "<|im_start|>assistant\n";

  PromptTokens out;
  const bool thinking = prompt.template_kwargs.value("enable_thinking", false);
  const auto mode = prompt.tool_choice.mode;
  if (tools && (mode == ToolChoice::Mode::kRequired || mode == ToolChoice::Mode::kFunction)) {
    // Forced tool call: skip thinking and open the call; a named function also gets its name.
    if (thinking) out.assistant_prefix = "<think>\n\n</think>\n\n";
    out.assistant_prefix += "<tool_call>\n";
    if (mode == ToolChoice::Mode::kFunction) {
      out.assistant_prefix += "{\"name\": \"" + prompt.tool_choice.function_name + "\", \"arguments\": ";
    }
  } else if (thinking) {
    out.assistant_prefix = "<think>\n";
  }
  text += out.assistant_prefix;
  out.ids = encode(text);
  return out;
}

Expected<PromptTokens> FakePromptBuilder::tokenize(std::string_view text) const {
  PromptTokens out;
  out.ids = encode(text);
  return out;
}

namespace {

// Re-parses the whole turn on every delta: simple, and fine for test-sized outputs.
class ReparsingTurnParser final : public TurnParser {
 public:
  ReparsingTurnParser(bool tools, std::string prefix) : tools_(tools), text_(std::move(prefix)) {}
  const ParsedOutput& feed(std::string_view delta) override {
    text_ += delta;
    parsed_ = FakeOutputParser::parse(text_, tools_, true);
    return parsed_;
  }
  const ParsedOutput& finish() override {
    parsed_ = FakeOutputParser::parse(text_, tools_, false);
    return parsed_;
  }

 private:
  bool tools_;
  std::string text_;
  ParsedOutput parsed_;
};

}  // namespace

std::unique_ptr<TurnParser> FakeOutputParser::start_turn(const ParseOptions& options,
                                                         const PromptTokens& prompt) const {
  return std::make_unique<ReparsingTurnParser>(options.tools, prompt.assistant_prefix);
}

ParsedOutput FakeOutputParser::parse(std::string_view text, bool tools, bool partial) {
  const TextOptions options{.tools = tools, .partial = partial};
  ParsedOutput out;
  // A turn that may still become "<think>" shows nothing yet.
  if (options.partial && text.size() < kThinkOpen.size() && kThinkOpen.substr(0, text.size()) == text)
    return out;
  std::string_view rest = text;
  if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) {
    rest.remove_prefix(kThinkOpen.size());
    const size_t close = rest.find(kThinkClose);
    if (close == std::string_view::npos) {
      std::string_view reasoning = rest;
      if (options.partial) reasoning.remove_suffix(partial_tag_suffix(reasoning, kThinkClose));
      while (!reasoning.empty() && reasoning.front() == '\n') reasoning.remove_prefix(1);
      // A trailing newline may be the one before "</think>": hold it while streaming.
      if (options.partial) {
        while (!reasoning.empty() && reasoning.back() == '\n') reasoning.remove_suffix(1);
      } else {
        reasoning = trim_newlines(reasoning);
      }
      out.reasoning_content = std::string(reasoning);
      return out;
    }
    out.reasoning_content = std::string(trim_newlines(rest.substr(0, close)));
    rest.remove_prefix(close + kThinkClose.size());
    while (!rest.empty() && rest.front() == '\n') rest.remove_prefix(1);
  }
  parse_content(rest, options, &out);
  return out;
}

Frontend make_fake_frontend() {
  return Frontend{std::make_shared<FakePromptBuilder>(), std::make_shared<FakeOutputParser>()};
}

}  // namespace pd::server::fake
