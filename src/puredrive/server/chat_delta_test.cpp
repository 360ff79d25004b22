// Streaming chat deltas (content, reasoning, tool calls) and the SSE / OpenAI object formats.
#include <gtest/gtest.h>

#include "puredrive/server/chat_delta.h"
#include "puredrive/server/openai_format.h"
#include "puredrive/server/testing/fake_frontend.h"

namespace pd::server {
namespace {

using nlohmann::json;

ParsedOutput parsed(std::string reasoning, std::string content, std::vector<ParsedToolCall> calls = {}) {
  return ParsedOutput{std::move(reasoning), std::move(content), std::move(calls)};
}

// Applies deltas the way a client does (the openai library's stream accumulation): concatenate text and
// argument pieces by tool-call index.
struct ClientView {
  std::string reasoning, content;
  std::vector<json> calls;
  void apply(const json& d) {
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (!d.contains("tool_calls")) return;
    for (const auto& tc : d["tool_calls"]) {
      const size_t i = tc["index"].get<size_t>();
      if (i == calls.size()) calls.push_back({{"id", tc.value("id", "")}, {"name", ""}, {"arguments", ""}});
      ASSERT_LT(i, calls.size()) << "tool call index skipped";
      if (tc.contains("function")) {
        if (tc["function"].contains("name")) calls[i]["name"] = tc["function"]["name"];
        if (tc["function"].contains("arguments")) {
          calls[i]["arguments"] =
              calls[i]["arguments"].get<std::string>() + tc["function"]["arguments"].get<std::string>();
        }
      }
    }
  }
};

TEST(ChatDeltaBuilder, TextDeltasConcatenateToTheFinalText) {
  ChatDeltaBuilder b;
  ClientView v;
  for (const auto& p :
       {parsed("thin", ""), parsed("thinking", ""), parsed("thinking", "Hel"), parsed("thinking", "Hello")}) {
    for (const auto& d : b.update(p)) v.apply(d);
  }
  EXPECT_EQ(v.reasoning, "thinking");
  EXPECT_EQ(v.content, "Hello");
  EXPECT_TRUE(b.update(parsed("thinking", "Hello")).empty());  // nothing new, nothing sent
}

TEST(ChatDeltaBuilder, ToolCallDeltasFollowOpenAIShape) {
  ChatDeltaBuilder b;
  std::vector<json> all;
  auto step = [&](const ParsedOutput& p) {
    for (auto& d : b.update(p)) all.push_back(d);
  };
  step(parsed("", "Let me check.", {{"", ""}}));  // call opened, name not known yet: nothing about it
  EXPECT_EQ(all.size(), 1u);
  step(parsed("", "Let me check.", {{"get_weather", "{\"ci"}}));
  step(parsed("", "Let me check.", {{"get_weather", "{\"city\": \"Paris\"}"}, {"get_time", ""}}));
  step(parsed("", "Let me check.", {{"get_weather", "{\"city\": \"Paris\"}"}, {"get_time", "{}"}}));

  // First tool delta: index, id, type, function.name and the arguments so far.
  const json& first = all[1]["tool_calls"][0];
  EXPECT_EQ(first["index"], 0);
  EXPECT_EQ(first["type"], "function");
  EXPECT_EQ(first["function"]["name"], "get_weather");
  EXPECT_EQ(first["function"]["arguments"], "{\"ci");
  EXPECT_EQ(first["id"].get<std::string>().rfind("call_", 0), 0u);
  // A continuation carries only index and arguments.
  const json& cont = all[2]["tool_calls"][0];
  EXPECT_EQ(cont.size(), 2u);
  EXPECT_EQ(cont["function"].size(), 1u);
  EXPECT_EQ(cont["function"]["arguments"], "ty\": \"Paris\"}");

  ClientView v;
  for (const auto& d : all) v.apply(d);
  ASSERT_EQ(v.calls.size(), 2u);
  EXPECT_EQ(v.calls[0]["name"], "get_weather");
  EXPECT_EQ(json::parse(v.calls[0]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
  EXPECT_EQ(v.calls[1]["name"], "get_time");
  EXPECT_EQ(v.calls[1]["arguments"], "{}");
  const auto ids = b.tool_call_ids();
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_NE(ids[0], ids[1]);
  EXPECT_EQ(v.calls[0]["id"], ids[0]);
}

TEST(ChatDeltaBuilder, StreamingTheFakeParserReproducesTheFinalParse) {
  // Feed a Hermes-style turn byte by byte through the fake parser, as the chat endpoint does, and check the
  // client's accumulated view equals the one-shot parse.
  const std::string turn =
      "<think>\nplan it\n</think>\n\nSure.<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": [1, {\"y\": "
      "2}]}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>";
  fake::FakeOutputParser parser;
  ParseOptions options;
  options.tools = true;
  auto turn_parser = parser.start_turn(options, PromptTokens{});
  ChatDeltaBuilder b;
  ClientView v;
  for (size_t n = 0; n < turn.size(); ++n) {
    for (const auto& d : b.update(turn_parser->feed(turn.substr(n, 1)))) v.apply(d);
  }
  const ParsedOutput final_parse = turn_parser->finish();
  for (const auto& d : b.update(final_parse)) v.apply(d);
  EXPECT_EQ(v.reasoning, "plan it");
  EXPECT_EQ(v.content, "Sure.");
  ASSERT_EQ(v.calls.size(), 2u);
  EXPECT_EQ(v.calls[0]["name"], "a");
  EXPECT_EQ(json::parse(v.calls[0]["arguments"].get<std::string>()), json::parse("{\"x\": [1, {\"y\": 2}]}"));
  EXPECT_EQ(v.calls[1]["name"], "b");
  EXPECT_EQ(v.calls[1]["arguments"], final_parse.tool_calls[1].arguments);
}

TEST(OpenAIFormat, SseFraming) {
  EXPECT_EQ(sse_data(json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
  EXPECT_EQ(sse_comment("keep-alive"), ": keep-alive\n\n");
  // JSON never contains a raw newline, so one event is one line.
  EXPECT_EQ(sse_data(json{{"t", "a\nb"}}), "data: {\"t\":\"a\\nb\"}\n\n");
}

TEST(OpenAIFormat, ChunkAndCompletionShapes) {
  const ResponseMeta meta{
      .id = "chatcmpl-x", .created = 1700000000, .model = "m", .system_fingerprint = "fp"};
  const json chunk = chat_chunk_json(meta, json{{"content", "hi"}}, nullptr, std::nullopt, true);
  EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  EXPECT_EQ(chunk["choices"][0]["index"], 0);
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(chunk["usage"].is_null());
  EXPECT_FALSE(chat_chunk_json(meta, json::object(), "stop", std::nullopt, false).contains("usage"));

  GenerationStats stats;
  stats.prompt_tokens = 7;
  stats.completion_tokens = 5;
  stats.cached_prompt_tokens = 2;
  const json usage = usage_chunk_json(meta, "chat.completion.chunk", stats);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 12);
  EXPECT_EQ(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 2);

  const ParsedOutput only_calls{"", "", {{"f", "{}"}}};
  const json msg = chat_message_json(only_calls, {"call_1"});
  EXPECT_TRUE(msg["content"].is_null());
  EXPECT_EQ(msg["tool_calls"][0]["id"], "call_1");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], "{}");
  EXPECT_STREQ(openai_finish_reason(FinishReason::kStop, true), "tool_calls");
  EXPECT_STREQ(openai_finish_reason(FinishReason::kContextFull, false), "length");
}

TEST(OpenAIFormat, LogprobsShapes) {
  std::vector<TokenLogprob> lps = {
      {.token_id = 1, .token = "he", .logprob = -0.5f, .top = {{1, "he", -0.5f}, {2, "ha", -1.5f}}},
      {.token_id = 3, .token = "\xe2\x82", .logprob = -0.25f, .top = {}}};
  const json chat = chat_logprob_entries(lps);
  ASSERT_EQ(chat.size(), 2u);
  EXPECT_EQ(chat[0]["bytes"], json::array({104, 101}));
  EXPECT_EQ(chat[0]["top_logprobs"][1]["token"], "ha");
  EXPECT_EQ(chat[1]["bytes"], json::array({0xe2, 0x82}));
  EXPECT_NO_THROW(dump_json(chat));  // a partial UTF-8 token is replaced in text, kept in bytes

  const json comp = completion_logprobs(lps, 10);
  EXPECT_EQ(comp["tokens"].size(), 2u);
  EXPECT_EQ(comp["text_offset"], json::array({10, 12}));
  EXPECT_FLOAT_EQ(comp["top_logprobs"][0]["ha"].get<float>(), -1.5f);
}

TEST(OpenAIFormat, IdsAreUniqueAndPrefixed) {
  const std::string a = new_id("chatcmpl-"), b = new_id("chatcmpl-");
  EXPECT_EQ(a.size(), 9u + 24u);
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace pd::server
