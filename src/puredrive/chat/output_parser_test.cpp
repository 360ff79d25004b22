// Output parser: reasoning / content / tool-call extraction, streaming at every split point, malformed
// output kept as text, and round trips through the real chat templates (render a tool call with the
// Qwen3.5 / Qwen3-Coder / Qwen3 template, parse it back).
#include "puredrive/chat/output_parser.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "puredrive/chat/chat_template.h"

namespace pd::chat {
namespace {

using ojson = nlohmann::ordered_json;

const ojson kTools = ojson::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"type": "string"}}}}},
  {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
      "query": {"type": "string"}, "limit": {"type": ["integer", "null"]}, "exact": {"type": "boolean"},
      "score": {"type": "number"}, "filters": {"type": "object"}, "tags": {"type": "array"}}}}}
])");

OutputParserOptions options(bool starts_in_reasoning = false) {
  OutputParserOptions o;
  o.tools = kTools;
  o.starts_in_reasoning = starts_in_reasoning;
  return o;
}

ParsedMessage parse_all(std::string_view text, const OutputParserOptions& o) {
  OutputParser p(o);
  p.feed(text);
  return p.finish();
}

// Feeds the pieces, checks that the events add up to the final message, returns it.
ParsedMessage parse_pieces(const std::vector<std::string_view>& pieces, const OutputParserOptions& o) {
  OutputParser p(o);
  std::vector<ParseEvent> events;
  for (auto piece : pieces) {
    auto ev = p.feed(piece);
    events.insert(events.end(), ev.begin(), ev.end());
  }
  ParsedMessage m = p.finish(&events);
  std::string content, reasoning;
  std::vector<ToolCall> calls;
  for (const auto& e : events) {
    switch (e.type) {
      case ParseEventType::kContent:
        content += e.text;
        break;
      case ParseEventType::kReasoning:
        reasoning += e.text;
        break;
      case ParseEventType::kToolCallStart:
        EXPECT_EQ(e.tool_index, calls.size());
        calls.push_back({e.id, e.name, ""});
        break;
      case ParseEventType::kToolCallArguments:
        EXPECT_EQ(e.tool_index + 1, calls.size());
        calls.back().arguments += e.text;
        break;
      case ParseEventType::kToolCallEnd:
        EXPECT_EQ(e.tool_index + 1, calls.size());
        break;
    }
  }
  EXPECT_EQ(content, m.content);
  EXPECT_EQ(reasoning, m.reasoning_content);
  EXPECT_EQ(calls.size(), m.tool_calls.size());
  for (size_t i = 0; i < calls.size() && i < m.tool_calls.size(); ++i) {
    EXPECT_EQ(calls[i].id, m.tool_calls[i].id);
    EXPECT_EQ(calls[i].name, m.tool_calls[i].name);
    EXPECT_EQ(calls[i].arguments, m.tool_calls[i].arguments);
  }
  return m;
}

void expect_same(const ParsedMessage& a, const ParsedMessage& b) {
  EXPECT_EQ(a.content, b.content);
  EXPECT_EQ(a.reasoning_content, b.reasoning_content);
  ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size());
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    EXPECT_EQ(a.tool_calls[i].name, b.tool_calls[i].name);
    EXPECT_EQ(a.tool_calls[i].arguments, b.tool_calls[i].arguments);
  }
}

TEST(OutputParser, PlainContent) {
  const auto m = parse_all("Hello, world!\nBye.", options());
  EXPECT_EQ(m.content, "Hello, world!\nBye.");
  EXPECT_EQ(m.reasoning_content, "");
  EXPECT_TRUE(m.tool_calls.empty());
}

TEST(OutputParser, ThinkBlockAtStart) {
  const auto m = parse_all("<think>\nLet me think.\nMore.\n</think>\n\nThe answer is 4.", options());
  EXPECT_EQ(m.reasoning_content, "Let me think.\nMore.");
  EXPECT_EQ(m.content, "The answer is 4.");
}

TEST(OutputParser, StartsInsideReasoning) {
  // Qwen3.5's generation prompt ends with "<think>\n": the output continues the reasoning.
  const auto m = parse_all("Thinking here.\n</think>\n\nDone.", options(true));
  EXPECT_EQ(m.reasoning_content, "Thinking here.");
  EXPECT_EQ(m.content, "Done.");
  // Truncated before </think>: all reasoning, no content.
  const auto t = parse_all("Still thinking\n", options(true));
  EXPECT_EQ(t.reasoning_content, "Still thinking");
  EXPECT_EQ(t.content, "");
}

TEST(OutputParser, ThinkOnlyRecognisedAtStart) {
  const auto m = parse_all("Use <think> tags like </think> this.", options());
  EXPECT_EQ(m.content, "Use <think> tags like </think> this.");
  EXPECT_EQ(m.reasoning_content, "");
  OutputParserOptions no_reasoning = options();
  no_reasoning.parse_reasoning = false;
  EXPECT_EQ(parse_all("<think>x</think>y", no_reasoning).content, "<think>x</think>y");
}

TEST(OutputParser, XmlToolCallTypedBySchema) {
  const std::string text =
      "Let me check.\n\n<tool_call>\n<function=search>\n<parameter=query>\nweather \"in\" "
      "<Paris>\n</parameter>\n"
      "<parameter=limit>\n5\n</parameter>\n<parameter=exact>\nTrue\n</parameter>\n<parameter=score>\n0.5\n</"
      "parameter>\n"
      "<parameter=filters>\n{\"lang\": \"fr\", \"n\": [1, 2.0]}\n</parameter>\n<parameter=tags>\n[\"a\", "
      "\"b\"]\n</parameter>\n"
      "</function>\n</tool_call>";
  const auto m = parse_all(text, options());
  EXPECT_EQ(m.content, "Let me check.");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "search");
  EXPECT_EQ(m.tool_calls[0].id, "call_0");
  EXPECT_EQ(
      m.tool_calls[0].arguments,
      R"({"query": "weather \"in\" <Paris>", "limit": 5, "exact": true, "score": 0.5, "filters": {"lang": "fr", "n": [1, 2.0]}, "tags": ["a", "b"]})");
}

TEST(OutputParser, XmlValuesFallBackToStrings) {
  const std::string text =
      "<tool_call>\n<function=search>\n<parameter=limit>\nfive\n</parameter>\n<parameter=exact>\nmaybe\n</"
      "parameter>\n"
      "<parameter=filters>\nnot "
      "json\n</parameter>\n<parameter=unknown>\n42\n</parameter>\n<parameter=query>\n\n"
      "multi\nline\n\n</parameter>\n</function>\n</tool_call>";
  const auto m = parse_all(text, options());
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(
      m.tool_calls[0].arguments,
      R"({"limit": "five", "exact": "maybe", "filters": "not json", "unknown": "42", "query": "\nmulti\nline\n"})");
  // A null for a nullable integer.
  const auto n = parse_all(
      "<tool_call>\n<function=search>\n<parameter=limit>\nnull\n</parameter>\n</function>\n</tool_call>",
      options());
  ASSERT_EQ(n.tool_calls.size(), 1u);
  EXPECT_EQ(n.tool_calls[0].arguments, R"({"limit": null})");
}

TEST(OutputParser, JsonToolCalls) {
  const std::string text =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": "
      "3}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"search\", \"arguments\": \"{\\\"query\\\": \\\"x\\\"}\"}\n</tool_call>";
  const auto m = parse_all(text, options());
  EXPECT_EQ(m.content, "");
  ASSERT_EQ(m.tool_calls.size(), 2u);
  EXPECT_EQ(m.tool_calls[0].name, "get_weather");
  EXPECT_EQ(m.tool_calls[0].arguments, R"({"city": "Paris", "days": 3})");
  EXPECT_EQ(m.tool_calls[1].name, "search");
  EXPECT_EQ(m.tool_calls[1].arguments, R"({"query": "x"})");
  EXPECT_EQ(m.tool_calls[1].id, "call_1");
}

TEST(OutputParser, MalformedOutputStaysText) {
  struct Case {
    const char* text;
    const char* content;
  };
  const Case cases[] = {
      {"Before <tool_call>\n{\"name\": \"get_weather\", \"argu",
       "Before <tool_call>\n{\"name\": \"get_weather\", \"argu"},
      {"<tool_call>\n{not json}\n</tool_call>", "<tool_call>\n{not json}\n</tool_call>"},
      {"<tool_call>\n{\"name\": \"no_such_tool\", \"arguments\": {}}\n</tool_call>",
       "<tool_call>\n{\"name\": \"no_such_tool\", \"arguments\": {}}\n</tool_call>"},
      {"<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</tool_call>",
       "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</tool_call>"},
      {"<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>",
       "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>"},
      {"<tool_call></tool_call>", "<tool_call></tool_call>"},
      {"Text ending in a partial tag <tool_ca", "Text ending in a partial tag <tool_ca"},
      {"A </tool_call> stray close", "A </tool_call> stray close"},
      {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": [1]}\n</tool_call>",
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": [1]}\n</tool_call>"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    const auto m = parse_pieces({c.text}, options());
    EXPECT_EQ(m.content, c.content);
    EXPECT_TRUE(m.tool_calls.empty());
  }
  // A valid call after a malformed one is still parsed; the malformed one is kept.
  const auto mixed = parse_all(
      "<tool_call>oops</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{}}\n</tool_call>",
      options());
  EXPECT_EQ(mixed.content, "<tool_call>oops</tool_call>");
  ASSERT_EQ(mixed.tool_calls.size(), 1u);
  EXPECT_EQ(mixed.tool_calls[0].arguments, "{}");
  // Arguments nested absurdly deep are not a tool call either.
  const std::string deep =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"x\": " + std::string(2000, '[') +
      std::string(2000, ']') + "}}\n</tool_call>";
  const auto deep_msg = parse_all(deep, options());
  EXPECT_TRUE(deep_msg.tool_calls.empty());
  EXPECT_EQ(deep_msg.content, deep);
  // An unknown tool with no tools declared is accepted.
  OutputParserOptions any_tool;
  const auto free_call =
      parse_all("<tool_call>\n{\"name\": \"anything\", \"arguments\": {}}\n</tool_call>", any_tool);
  ASSERT_EQ(free_call.tool_calls.size(), 1u);
  EXPECT_EQ(free_call.tool_calls[0].name, "anything");
}

TEST(OutputParser, TextAfterToolCallIsContent) {
  const auto m = parse_all(
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n\nAnd "
      "some words.",
      options());
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.content, "And some words.");
}

TEST(OutputParser, ToolCallInsideReasoningIsACall) {
  const std::string call =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>";
  // The reasoning never closes: the turn ends after the call.
  const auto open = parse_pieces({"I need the weather.\n", call}, options(true));
  EXPECT_EQ(open.reasoning_content, "I need the weather.");
  EXPECT_EQ(open.content, "");
  ASSERT_EQ(open.tool_calls.size(), 1u);
  EXPECT_EQ(open.tool_calls[0].name, "get_weather");
  EXPECT_EQ(open.tool_calls[0].arguments, R"({"city": "Paris"})");
  // The reasoning resumes after the call and closes; the model's newlines between the parts stay.
  const auto resumed = parse_all("<think>\nPlan.\n" + call + "\nMore thought.\n</think>\n\nDone.", options());
  EXPECT_EQ(resumed.reasoning_content, "Plan.\n\nMore thought.");
  EXPECT_EQ(resumed.content, "Done.");
  ASSERT_EQ(resumed.tool_calls.size(), 1u);
  // A malformed or unknown call stays reasoning text, verbatim.
  const auto unknown = parse_all(
      "Hmm.\n<tool_call>\n{\"name\": \"no_such_tool\", \"arguments\": {}}\n</tool_call>\nOk.", options(true));
  EXPECT_EQ(unknown.reasoning_content,
            "Hmm.\n<tool_call>\n{\"name\": \"no_such_tool\", \"arguments\": {}}\n</tool_call>\nOk.");
  EXPECT_TRUE(unknown.tool_calls.empty());
  const auto unterminated = parse_all("Hmm.\n<tool_call>\n<function=get_weather>", options(true));
  EXPECT_EQ(unterminated.reasoning_content, "Hmm.\n<tool_call>\n<function=get_weather>");
  EXPECT_TRUE(unterminated.tool_calls.empty());
  // Without tools (or tool_choice none) the markup is reasoning text, as before.
  OutputParserOptions no_tools = options(true);
  no_tools.parse_tool_calls = false;
  const auto plain = parse_all("Plan.\n" + call, no_tools);
  EXPECT_EQ(plain.reasoning_content, "Plan.\n" + call);
  EXPECT_TRUE(plain.tool_calls.empty());
}

// The same output split at every byte (two pieces), at every pair of bytes (three pieces) and byte by byte
// must parse exactly like the whole string.
void check_all_splits(const std::string& text, const OutputParserOptions& o) {
  const ParsedMessage whole = parse_all(text, o);
  for (size_t i = 0; i <= text.size(); ++i) {
    SCOPED_TRACE("split at " + std::to_string(i));
    const std::string_view s(text);
    expect_same(parse_pieces({s.substr(0, i), s.substr(i)}, o), whole);
  }
  // Three pieces: a grid of about 40 x 40 split pairs keeps long texts fast (and sanitizer runs short).
  const size_t step = std::max<size_t>(1, text.size() / 40);
  for (size_t i = 0; i <= text.size(); i += step) {
    for (size_t j = i; j <= text.size(); j += step) {
      const std::string_view s(text);
      expect_same(parse_pieces({s.substr(0, i), s.substr(i, j - i), s.substr(j)}, o), whole);
    }
  }
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(std::string_view(text).substr(i, 1));
  expect_same(parse_pieces(bytes, o), whole);
}

TEST(OutputParser, EverySplitPointXml) {
  const std::string text =
      "<think>\nPlan: call the tool.\n</think>\n\nChecking now.\n\n<tool_call>\n<function=get_weather>\n"
      "<parameter=city>\nSão Paulo "
      "🌧\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n"
      "<tool_call>\n<function=search>\n<parameter=query>\nrain\n</parameter>\n</function>\n</tool_call>";
  const auto whole = parse_all(text, options());
  EXPECT_EQ(whole.reasoning_content, "Plan: call the tool.");
  EXPECT_EQ(whole.content, "Checking now.");
  ASSERT_EQ(whole.tool_calls.size(), 2u);
  EXPECT_EQ(whole.tool_calls[0].arguments, R"({"city": "São Paulo 🌧", "days": 3})");
  check_all_splits(text, options());
}

TEST(OutputParser, EverySplitPointJsonAndMalformed) {
  check_all_splits(
      "Answer <b>bold</b> <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Rome\"}}\n</tool_call>"
      " tail <tool_call>\nbroken\n</tool_call> <tool_ca",
      options());
  check_all_splits(
      "reasoning continues\n\n</think>\n\n<tool_call>\n{\"name\": \"search\", \"arguments\": "
      "{}}\n</tool_call>",
      options(true));
}

TEST(OutputParser, EverySplitPointCallInsideReasoning) {
  check_all_splits(
      "Plan.\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}\n</tool_call>\nThen "
      "<tool_ca\n<tool_call>oops</tool_call>\n</think>\n\nDone.",
      options(true));
}

TEST(OutputParser, PromptOpensReasoning) {
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n"));
  EXPECT_TRUE(prompt_opens_reasoning("<think>a</think>x<|im_start|>assistant\n<think>\n"));
}

// ---- round trips through the real templates ----

std::string read_template(const std::string& file) {
  const auto path = std::filesystem::path(PD_SOURCE_DIR) / "tests" / "data" / "templates" / file;
  std::ifstream in(path);
  if (!in.good()) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const ojson kAssistantCalls = ojson::parse(R"([
  {"role": "user", "content": "Weather and search, please."},
  {"role": "assistant", "content": "Sure, calling tools.", "reasoning_content": "Two calls needed.\nFirst weather.",
   "tool_calls": [
     {"id": "a", "type": "function", "function": {"name": "get_weather",
      "arguments": {"city": "Zürich \"old town\"", "days": 7, "unit": "celsius"}}},
     {"id": "b", "type": "function", "function": {"name": "search",
      "arguments": {"query": "line1\nline2 <b>", "limit": 10, "exact": false, "score": 2.5,
                    "filters": {"a": [1, 2], "b": {"c": null}}, "tags": ["x", "y"]}}}
   ]}
])");

// What the model generated for the last assistant turn: the rendered text after the last
// "<|im_start|>assistant\n", up to "<|im_end|>".
std::string assistant_turn(const std::string& rendered) {
  const std::string marker = "<|im_start|>assistant\n";
  const size_t start = rendered.rfind(marker);
  const size_t end = rendered.find("<|im_end|>", start);
  return rendered.substr(start + marker.size(), end - start - marker.size());
}

void expect_round_trip(const ParsedMessage& m) {
  const ojson& original = kAssistantCalls[1];
  EXPECT_EQ(m.content, original["content"].get<std::string>());
  ASSERT_EQ(m.tool_calls.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(m.tool_calls[i].name, original["tool_calls"][i]["function"]["name"].get<std::string>());
    EXPECT_EQ(ojson::parse(m.tool_calls[i].arguments), original["tool_calls"][i]["function"]["arguments"])
        << m.tool_calls[i].arguments;
  }
}

TEST(OutputParserRoundTrip, Qwen35XmlTemplate) {
  const std::string source = read_template("Qwen3.5-4B.jinja");
  ASSERT_FALSE(source.empty()) << "tests/data/templates/Qwen3.5-4B.jinja is missing or empty";
  auto tmpl = ChatTemplate::from_source(source);
  ASSERT_TRUE(tmpl.has_value()) << tmpl.status().message();
  ChatInputs in;
  in.messages = kAssistantCalls;
  in.tools = kTools;
  auto rendered = tmpl->render(in);
  ASSERT_TRUE(rendered.has_value()) << rendered.status().message();
  const std::string turn = assistant_turn(*rendered);
  ASSERT_EQ(turn.rfind("<think>\n", 0), 0u) << turn;
  // As generated after a "<think>\n" generation prompt, and as a whole turn.
  const auto m = parse_pieces({std::string_view(turn).substr(8)}, options(true));
  EXPECT_EQ(m.reasoning_content, kAssistantCalls[1]["reasoning_content"].get<std::string>());
  expect_round_trip(m);
  expect_round_trip(parse_all(turn, options()));
  check_all_splits(turn.substr(8), options(true));
}

TEST(OutputParserRoundTrip, Qwen3CoderXmlTemplate) {
  const std::string source = read_template("Qwen3-Coder.jinja");
  ASSERT_FALSE(source.empty()) << "tests/data/templates/Qwen3-Coder.jinja is missing or empty";
  auto tmpl = ChatTemplate::from_source(source);
  ASSERT_TRUE(tmpl.has_value()) << tmpl.status().message();
  ChatInputs in;
  in.messages = kAssistantCalls;
  in.tools = kTools;
  auto rendered = tmpl->render(in);
  ASSERT_TRUE(rendered.has_value()) << rendered.status().message();
  OutputParserOptions o = options();
  o.parse_reasoning = false;
  expect_round_trip(parse_all(assistant_turn(*rendered), o));
}

TEST(OutputParserRoundTrip, Qwen3JsonTemplate) {
  const std::string source = read_template("Qwen-Qwen3-0.6B.jinja");
  ASSERT_FALSE(source.empty()) << "tests/data/templates/Qwen-Qwen3-0.6B.jinja is missing or empty";
  auto tmpl = ChatTemplate::from_source(source);
  ASSERT_TRUE(tmpl.has_value()) << tmpl.status().message();
  ChatInputs in;
  in.messages = kAssistantCalls;
  in.tools = kTools;
  auto rendered = tmpl->render(in);
  ASSERT_TRUE(rendered.has_value()) << rendered.status().message();
  const auto m = parse_all(assistant_turn(*rendered), options());
  EXPECT_EQ(m.reasoning_content, kAssistantCalls[1]["reasoning_content"].get<std::string>());
  expect_round_trip(m);
}

}  // namespace
}  // namespace pd::chat
