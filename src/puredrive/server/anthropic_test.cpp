// Anthropic Messages API: request validation and mapping onto chat prompts, the error shape, the message
// and usage objects, and the stream events (checked by accumulating them the way the anthropic SDK does).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "puredrive/server/anthropic_format.h"
#include "puredrive/server/anthropic_request.h"

namespace pd::server {
namespace {

using nlohmann::json;

RequestLimits messages_limits() {
  return RequestLimits{.model_names = {"m"}, .vocab_size = 1000};
}

const json kUser = {{"role", "user"}, {"content", "hi"}};
const json kTool = {{"name", "get_weather"},
                    {"description", "Weather of a city"},
                    {"input_schema", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}};

// A valid /v1/messages body with one field replaced or added.
std::string body_with(const char* key, json value) {
  json j = {{"model", "m"}, {"max_tokens", 64}, {"messages", json::array({kUser})}};
  j[key] = std::move(value);
  return j.dump();
}

struct MessagesBadCase {
  const char* name;
  std::string body;
  int status;
  const char* param;  // "" for none
  const char* code;
  const char* message_part;
};

TEST(MessagesRequestParser, RejectsBadInputWithAnthropicErrors) {
  const json tool_result_image = {
      {"role", "user"},
      {"content",
       json::array({{{"type", "tool_result"},
                     {"tool_use_id", "t1"},
                     {"content", json::array({{{"type", "image"}, {"source", json::object()}}})}}})}};
  const std::vector<MessagesBadCase> cases = {
      {"empty body", "", 400, "", "", "empty"},
      {"malformed json", "{\"model\":", 400, "", "", "could not parse"},
      {"missing model", json{{"max_tokens", 4}, {"messages", json::array({kUser})}}.dump(), 400, "model",
       "missing_required_parameter", "'model'"},
      {"unknown model", body_with("model", "claude-x"), 404, "model", "model_not_found", "does not exist"},
      {"missing max_tokens", json{{"model", "m"}, {"messages", json::array({kUser})}}.dump(), 400,
       "max_tokens", "missing_required_parameter", "'max_tokens'"},
      {"max_tokens zero", body_with("max_tokens", 0), 400, "max_tokens", "invalid_value", "between 1"},
      {"temperature over 1", body_with("temperature", 1.5), 400, "temperature", "invalid_value",
       "between 0 and 1"},
      {"top_p type", body_with("top_p", "x"), 400, "top_p", "invalid_type", "a number"},
      {"stream type", body_with("stream", 1), 400, "stream", "invalid_type", "a boolean"},
      {"stop_sequences string", body_with("stop_sequences", "END"), 400, "stop_sequences", "invalid_type",
       "array of strings"},
      {"too many stop_sequences", body_with("stop_sequences", json(std::vector<std::string>(65, "x"))), 400,
       "stop_sequences", "invalid_value", "at most 64"},
      {"missing messages", json{{"model", "m"}, {"max_tokens", 4}}.dump(), 400, "messages",
       "missing_required_parameter", "'messages'"},
      {"empty messages", body_with("messages", json::array()), 400, "messages", "empty_array",
       "at least one"},
      {"system role in messages",
       body_with("messages", json::array({{{"role", "system"}, {"content", "x"}}, kUser})), 400,
       "messages[0].role", "invalid_value", "top-level 'system'"},
      {"missing content", body_with("messages", json::array({{{"role", "user"}}})), 400,
       "messages[0].content", "missing_required_parameter", "messages[0].content"},
      {"empty content blocks",
       body_with("messages", json::array({{{"role", "user"}, {"content", json::array()}}})), 400,
       "messages[0].content", "empty_array", "at least one content block"},
      {"image block",
       body_with("messages",
                 json::array(
                     {{{"role", "user"},
                       {"content", json::array({{{"type", "image"}, {"source", {{"type", "base64"}}}}})}}})),
       400, "messages[0].content[0].type", "unsupported_content_type", "text-only model"},
      {"image in a tool result", body_with("messages", json::array({tool_result_image})), 400,
       "messages[0].content[0].content[0].type", "unsupported_content_type", "text-only model"},
      {"tool_use in a user turn",
       body_with("messages",
                 json::array(
                     {{{"role", "user"}, {"content", json::array({{{"type", "tool_use"}, {"id", "t"}}})}}})),
       400, "messages[0].content[0].type", "invalid_value", "'text' or 'tool_result'"},
      {"text block without text",
       body_with("messages",
                 json::array({{{"role", "user"}, {"content", json::array({{{"type", "text"}}})}}})),
       400, "messages[0].content[0].text", "missing_required_parameter", "text"},
      {"tool_result without id",
       body_with("messages",
                 json::array({{{"role", "user"}, {"content", json::array({{{"type", "tool_result"}}})}}})),
       400, "messages[0].content[0].tool_use_id", "missing_required_parameter", "tool_use_id"},
      {"tool_use input not an object",
       body_with(
           "messages",
           json::array({kUser,
                        {{"role", "assistant"},
                         {"content",
                          json::array({{{"type", "tool_use"}, {"id", "t"}, {"name", "f"}, {"input", "x"}}})}},
                        kUser})),
       400, "messages[1].content[0].input", "invalid_type", "an object"},
      {"assistant prefill",
       body_with("messages", json::array({kUser, {{"role", "assistant"}, {"content", "Sure"}}})), 400,
       "messages[1]", "unsupported_value", "prefill"},
      {"system number", body_with("system", 5), 400, "system", "invalid_type", "text blocks"},
      {"system image", body_with("system", json::array({{{"type", "image"}}})), 400, "system[0].type",
       "unsupported_content_type", "text-only"},
      {"tools not array", body_with("tools", kTool), 400, "tools", "invalid_type", "an array"},
      {"server tool",
       body_with("tools", json::array({{{"type", "web_search_20250305"}, {"name", "web_search"}}})), 400,
       "tools[0].type", "unsupported_value", "custom tools"},
      {"bad tool name",
       body_with("tools", json::array({{{"name", "a b"}, {"input_schema", json::object()}}})), 400,
       "tools[0].name", "invalid_value", "does not match"},
      {"duplicate tool", body_with("tools", json::array({kTool, kTool})), 400, "tools[1].name",
       "invalid_value", "Duplicate"},
      {"missing input_schema", body_with("tools", json::array({{{"name", "f"}}})), 400,
       "tools[0].input_schema", "missing_required_parameter", "input_schema"},
      {"tool_choice string", body_with("tool_choice", "auto"), 400, "tool_choice", "invalid_type",
       "an object"},
      {"tool_choice type", body_with("tool_choice", {{"type", "required"}}), 400, "tool_choice.type",
       "invalid_value", "'any'"},
      {"tool_choice any without tools", body_with("tool_choice", {{"type", "any"}}), 400, "tool_choice",
       "invalid_value", "requires 'tools'"},
      {"thinking type", body_with("thinking", {{"type", "on"}}), 400, "thinking.type", "invalid_value",
       "'enabled', 'adaptive' or 'disabled'"},
      {"thinking without budget", body_with("thinking", {{"type", "enabled"}}), 400, "thinking.budget_tokens",
       "missing_required_parameter", "budget_tokens"},
      {"thinking budget too small", body_with("thinking", {{"type", "enabled"}, {"budget_tokens", 100}}), 400,
       "thinking.budget_tokens", "invalid_value", "between 1024"},
      {"thinking budget over max_tokens",
       body_with("thinking", {{"type", "enabled"}, {"budget_tokens", 2048}}), 400, "thinking.budget_tokens",
       "invalid_value", "must be greater"},
      {"structured output", body_with("output_config", {{"format", {{"type", "json_schema"}}}}), 400,
       "output_config.format", "unsupported_parameter", "constrained decoding"},
      {"enable_thinking type", body_with("chat_template_kwargs", {{"enable_thinking", 1}}), 400,
       "chat_template_kwargs.enable_thinking", "invalid_type", "a boolean"},
  };
  ASSERT_GE(cases.size(), 30u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    MessagesRequest req;
    auto err = parse_messages_request(c.body, messages_limits(), MessagesCall::kCreate, &req);
    ASSERT_TRUE(err.has_value()) << "accepted";
    EXPECT_EQ(err->status, c.status) << err->message;
    EXPECT_EQ(err->param, c.param);
    EXPECT_EQ(err->code, c.code);
    EXPECT_NE(err->message.find(c.message_part), std::string::npos) << err->message;
    // Anthropic's shape: exactly {"type": "error", "error": {"type", "message"}}.
    const json body = anthropic_error_json(*err);
    EXPECT_EQ(body.size(), 2u);
    EXPECT_EQ(body["type"], "error");
    EXPECT_EQ(body["error"].size(), 2u);
    EXPECT_EQ(body["error"]["type"], c.status == 404 ? "not_found_error" : "invalid_request_error");
    EXPECT_EQ(body["error"]["message"], err->message);
  }
}

TEST(MessagesRequestParser, MapsAConversationOntoTheChatPrompt) {
  const json body = {
      {"model", "m"},
      {"max_tokens", 4096},
      {"system",
       json::array({{{"type", "text"}, {"text", "Be brief."}, {"cache_control", {{"type", "ephemeral"}}}},
                    {{"type", "text"}, {"text", " Use tools."}}})},
      {"messages",
       json::array(
           {{{"role", "user"}, {"content", "Weather in Paris?"}},
            {{"role", "assistant"},
             {"content",
              json::array({{{"type", "thinking"}, {"thinking", "Need a tool."}, {"signature", "sig"}},
                           {{"type", "redacted_thinking"}, {"data", "opaque"}},
                           {{"type", "tool_use"},
                            {"id", "toolu_1"},
                            {"name", "get_weather"},
                            {"input", {{"city", "Paris"}, {"days", 2}}}}})}},
            {{"role", "user"},
             {"content",
              json::array({{{"type", "tool_result"}, {"tool_use_id", "toolu_1"}, {"content", "sunny"}},
                           {{"type", "tool_result"},
                            {"tool_use_id", "toolu_2"},
                            {"is_error", true},
                            {"content", json::array({{{"type", "text"}, {"text", "a"}},
                                                     {{"type", "text"}, {"text", "b"}}})}},
                           {{"type", "text"}, {"text", "Thanks. "}},
                           {{"type", "text"}, {"text", "And tomorrow?"}}})}}})},
      {"tools", json::array({kTool})},
      {"tool_choice", {{"type", "tool"}, {"name", "get_weather"}, {"disable_parallel_tool_use", true}}},
      {"thinking", {{"type", "enabled"}, {"budget_tokens", 2048}}},
      {"stop_sequences", json::array({"END", "STOP"})},
      {"temperature", 0.5},
      {"top_p", 0.9},
      {"top_k", 20},
      {"stream", true},
      {"metadata", {{"user_id", "u"}}},
      {"service_tier", "auto"},
      {"output_config", {{"effort", "high"}}},
  };
  MessagesRequest req;
  auto err = parse_messages_request(body.dump(), messages_limits(), MessagesCall::kCreate, &req);
  ASSERT_FALSE(err) << err->message;
  const auto& msgs = req.prompt.messages;
  ASSERT_EQ(msgs.size(), 6u);
  EXPECT_EQ(msgs[0].role, "system");
  EXPECT_EQ(msgs[0].content, "Be brief. Use tools.");
  EXPECT_EQ(msgs[1].role, "user");
  EXPECT_EQ(msgs[2].role, "assistant");
  EXPECT_TRUE(msgs[2].content_is_null);
  EXPECT_EQ(msgs[2].reasoning_content, "Need a tool.");
  ASSERT_EQ(msgs[2].tool_calls.size(), 1u);
  EXPECT_EQ(msgs[2].tool_calls[0].id, "toolu_1");
  EXPECT_EQ(msgs[2].tool_calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(msgs[2].tool_calls[0].arguments), json({{"city", "Paris"}, {"days", 2}}));
  EXPECT_EQ(msgs[3].role, "tool");
  EXPECT_EQ(msgs[3].tool_call_id, "toolu_1");
  EXPECT_EQ(msgs[3].content, "sunny");
  EXPECT_EQ(msgs[4].role, "tool");
  EXPECT_EQ(msgs[4].content, "ab");
  EXPECT_EQ(msgs[5].role, "user");
  EXPECT_EQ(msgs[5].content, "Thanks. And tomorrow?");
  ASSERT_EQ(req.prompt.tools.size(), 1u);
  EXPECT_EQ(req.prompt.tools[0].dump(),
            R"({"type":"function","function":{"name":"get_weather","description":"Weather of a city",)"
            R"("parameters":{"properties":{"city":{"type":"string"}},"type":"object"}}})");  // as sent
  EXPECT_EQ(req.prompt.tool_choice.mode, ToolChoice::Mode::kFunction);
  EXPECT_EQ(req.prompt.tool_choice.function_name, "get_weather");
  EXPECT_FALSE(req.parallel_tool_calls);
  EXPECT_EQ(req.prompt.template_kwargs["enable_thinking"], true);
  EXPECT_EQ(req.common.stop, (std::vector<std::string>{"END", "STOP"}));
  EXPECT_EQ(req.common.max_tokens, 4096);
  EXPECT_TRUE(req.common.stream);
  EXPECT_FLOAT_EQ(req.common.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(req.common.sampling.top_p, 0.9f);
  EXPECT_EQ(req.common.sampling.top_k, 20);
}

TEST(MessagesRequestParser, ThinkingAndToolChoiceForms) {
  auto parse = [](const std::string& body) {
    MessagesRequest req;
    auto err = parse_messages_request(body, messages_limits(), MessagesCall::kCreate, &req);
    EXPECT_FALSE(err) << err->message;
    return req;
  };
  // No thinking parameter: the template's default; the explicit parameter wins over chat_template_kwargs.
  EXPECT_FALSE(
      parse(body_with("metadata", json::object())).prompt.template_kwargs.contains("enable_thinking"));
  EXPECT_EQ(parse(body_with("thinking", {{"type", "disabled"}})).prompt.template_kwargs["enable_thinking"],
            false);
  EXPECT_EQ(parse(body_with("thinking", {{"type", "adaptive"}})).prompt.template_kwargs["enable_thinking"],
            true);
  json both = json::parse(body_with("thinking", {{"type", "disabled"}}));
  both["chat_template_kwargs"] = {{"enable_thinking", true}, {"other", 1}};
  const MessagesRequest b = parse(both.dump());
  EXPECT_EQ(b.prompt.template_kwargs["enable_thinking"], false);
  EXPECT_EQ(b.prompt.template_kwargs["other"], 1);

  json tools = json::parse(body_with("tools", json::array({kTool})));
  for (const auto& [type, mode] :
       {std::pair{"auto", ToolChoice::Mode::kAuto}, std::pair{"any", ToolChoice::Mode::kRequired},
        std::pair{"none", ToolChoice::Mode::kNone}}) {
    tools["tool_choice"] = {{"type", type}};
    const MessagesRequest r = parse(tools.dump());
    EXPECT_EQ(r.prompt.tool_choice.mode, mode) << type;
    EXPECT_TRUE(r.parallel_tool_calls);
  }
  tools["tool_choice"] = {{"type", "tool"}, {"name", "nope"}};
  MessagesRequest req;
  auto err = parse_messages_request(tools.dump(), messages_limits(), MessagesCall::kCreate, &req);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->param, "tool_choice.name");
}

TEST(MessagesRequestParser, CountTokensNeedsNoMaxTokens) {
  const json body = {{"model", "m"}, {"messages", json::array({kUser})}, {"system", "s"}};
  MessagesRequest req;
  EXPECT_FALSE(parse_messages_request(body.dump(), messages_limits(), MessagesCall::kCountTokens, &req));
  EXPECT_EQ(req.prompt.messages.size(), 2u);
  MessagesRequest create;
  auto err = parse_messages_request(body.dump(), messages_limits(), MessagesCall::kCreate, &create);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->param, "max_tokens");
}

TEST(AnthropicFormat, ErrorTypesAndStatuses) {
  struct Case {
    ApiError error;
    int status;
    const char* type;
  };
  const Case cases[] = {
      {api_error(401, "invalid_request_error", "k", "invalid_api_key"), 401, "authentication_error"},
      {api_error(404, "invalid_request_error", "u", "unknown_url"), 404, "not_found_error"},
      {api_error(405, "invalid_request_error", "m", "method_not_allowed"), 405, "invalid_request_error"},
      {api_error(413, "invalid_request_error", "b", "payload_too_large"), 413, "request_too_large"},
      {api_error(500, "server_error", "x"), 500, "api_error"},
      {api_error(503, "server_error", "q", "queue_full"), 529, "overloaded_error"},
      {api_error(503, "server_error", "s", "shutting_down"), 503, "overloaded_error"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(anthropic_status(c.error), c.status) << c.error.code;
    const json j = anthropic_error_json(c.error);
    EXPECT_EQ(j["error"]["type"], c.type) << c.error.code;
    EXPECT_EQ(j["error"]["message"], c.error.message);
  }
  EXPECT_TRUE(anthropic_endpoint("/v1/messages"));
  EXPECT_TRUE(anthropic_endpoint("/v1/messages/count_tokens"));
  EXPECT_FALSE(anthropic_endpoint("/v1/messagesx"));
  EXPECT_FALSE(anthropic_endpoint("/v1/chat/completions"));
}

TEST(AnthropicFormat, StopReasons) {
  GenerationResult r;
  EXPECT_STREQ(anthropic_stop_reason(r, false, false), "end_turn");
  EXPECT_STREQ(anthropic_stop_reason(r, true, false), "tool_use");
  r.stop_string = "END";
  EXPECT_STREQ(anthropic_stop_reason(r, true, false), "stop_sequence");
  r.reason = FinishReason::kLength;
  EXPECT_STREQ(anthropic_stop_reason(r, true, false), "max_tokens");
  EXPECT_STREQ(anthropic_stop_reason(r, false, true), "model_context_window_exceeded");
  r.reason = FinishReason::kContextFull;
  EXPECT_STREQ(anthropic_stop_reason(r, false, false), "model_context_window_exceeded");
}

TEST(AnthropicFormat, MessageShape) {
  const ParsedOutput parsed{"Hmm.", "Calling.", {{"get_weather", R"({"city": "Paris"})"}, {"f", "{}"}}};
  GenerationStats stats;
  stats.prompt_tokens = 30;
  stats.cached_prompt_tokens = 10;
  stats.completion_tokens = 7;
  const json j =
      message_json(MessageMeta{.id = "msg_1", .model = "m"},
                   message_content_json(parsed, {"toolu_a", "toolu_b"}), "tool_use", std::nullopt, stats);
  const json expected = json::parse(R"({
    "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
    "content": [{"type": "thinking", "thinking": "Hmm.", "signature": ""},
                {"type": "text", "text": "Calling."},
                {"type": "tool_use", "id": "toolu_a", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_b", "name": "f", "input": {}}],
    "stop_reason": "tool_use", "stop_sequence": null,
    "usage": {"input_tokens": 20, "output_tokens": 7, "cache_read_input_tokens": 10,
              "cache_creation_input_tokens": 0}})");
  EXPECT_EQ(j, expected);
  // Field order as Anthropic sends it, and tool inputs in the order the model wrote them.
  EXPECT_EQ(
      dump_json(message_json(
          MessageMeta{.id = "msg_1", .model = "m"},
          message_content_json(ParsedOutput{"", "", {{"f", R"({"path": "x", "end": 1})"}}}, {"toolu_a"}),
          "tool_use", std::nullopt, GenerationStats{})),
      R"({"id":"msg_1","type":"message","role":"assistant","model":"m","content":[{"type":"tool_use",)"
      R"("id":"toolu_a","name":"f","input":{"path":"x","end":1}}],"stop_reason":"tool_use",)"
      R"("stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0,"cache_read_input_tokens":0,)"
      R"("cache_creation_input_tokens":0}})");
  // An empty turn has no blocks at all.
  EXPECT_EQ(message_content_json(ParsedOutput{}, {}), json::array());
  EXPECT_EQ(sse_event(message_stop_event()), "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
  EXPECT_EQ(sse_event(ping_event()), "event: ping\ndata: {\"type\":\"ping\"}\n\n");
}

// Accumulates stream events as the anthropic SDK does (lib/streaming: content_block_start appends a block,
// deltas extend the block at their index, input_json_delta text is parsed when the block is done).
struct SdkView {
  json content = json::array();
  std::vector<std::string> partial_json;
  std::vector<bool> stopped;
  void apply(const json& e) {
    const std::string type = e["type"];
    if (type == "content_block_start") {
      ASSERT_EQ(e["index"].get<size_t>(), content.size()) << "blocks must start in index order";
      content.push_back(e["content_block"]);
      partial_json.emplace_back();
      stopped.push_back(false);
    } else if (type == "content_block_delta") {
      const size_t i = e["index"];
      ASSERT_LT(i, content.size());
      const json& d = e["delta"];
      if (d["type"] == "text_delta")
        content[i]["text"] = content[i]["text"].get<std::string>() + d["text"].get<std::string>();
      if (d["type"] == "thinking_delta") {
        content[i]["thinking"] = content[i]["thinking"].get<std::string>() + d["thinking"].get<std::string>();
      }
      if (d["type"] == "input_json_delta") partial_json[i] += d["partial_json"].get<std::string>();
    } else if (type == "content_block_stop") {
      const size_t i = e["index"];
      ASSERT_LT(i, content.size());
      EXPECT_FALSE(stopped[i]) << "block " << i << " stopped twice";
      stopped[i] = true;
      if (content[i]["type"] == "tool_use" && !partial_json[i].empty())
        content[i]["input"] = json::parse(partial_json[i]);
    } else {
      ADD_FAILURE() << "unexpected event " << e.dump();
    }
  }
};

TEST(MessageEventBuilder, EventsAccumulateToTheFinalContent) {
  const std::vector<ParsedOutput> parses = {
      {"Thin", "", {}},
      {"Thinking.", "", {}},
      {"Thinking.", "Let me", {}},
      {"Thinking.", "Let me check.", {{"", ""}}},  // a call opened, its name not yet known: nothing about it
      {"Thinking.", "Let me check.", {{"get_weather", R"({"city": )"}}},
      {"Thinking.", "Let me check.", {{"get_weather", R"({"city": "Paris"})"}, {"f", ""}}},
      {"Thinking.", "Let me check.", {{"get_weather", R"({"city": "Paris"})"}, {"f", "{}"}}},
  };
  MessageEventBuilder b;
  SdkView v;
  std::vector<json> events;
  for (const auto& p : parses) {
    for (const auto& e : b.update(p)) events.push_back(e);
  }
  EXPECT_TRUE(b.update(parses.back()).empty());  // nothing new, nothing sent
  for (const auto& e : b.finish()) events.push_back(e);
  for (const auto& e : events) v.apply(e);
  ASSERT_EQ(v.content.size(), 4u);
  for (bool s : v.stopped) EXPECT_TRUE(s);
  // The same content as the non-streaming message, ids aside.
  const json final_blocks = message_content_json(
      parses.back(), {v.content[2]["id"].get<std::string>(), v.content[3]["id"].get<std::string>()});
  EXPECT_EQ(v.content, final_blocks);
  EXPECT_EQ(v.content[2]["id"].get<std::string>().rfind("toolu_", 0), 0u);
  EXPECT_NE(v.content[2]["id"], v.content[3]["id"]);
  // Each block is stopped before the next one starts.
  EXPECT_EQ(
      events.front(),
      json::parse(
          R"({"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}})"));
  for (size_t i = 1; i < events.size(); ++i) {
    if (events[i]["type"] == "content_block_start") {
      EXPECT_EQ(events[i - 1],
                json({{"type", "content_block_stop"}, {"index", events[i]["index"].get<int>() - 1}}));
    }
  }
}

TEST(MessageEventBuilder, AKindThatResumesOpensANewBlock) {
  // A call written inside the reasoning, then more reasoning: thinking, tool_use, thinking.
  MessageEventBuilder b;
  SdkView v;
  for (const auto& p : std::vector<ParsedOutput>{
           {"Plan.", "", {}}, {"Plan.", "", {{"f", "{}"}}}, {"Plan.\n\nMore.", "", {{"f", "{}"}}}}) {
    for (const auto& e : b.update(p)) v.apply(e);
  }
  for (const auto& e : b.finish()) v.apply(e);
  ASSERT_EQ(v.content.size(), 3u);
  EXPECT_EQ(v.content[0]["thinking"], "Plan.");
  EXPECT_EQ(v.content[1]["type"], "tool_use");
  EXPECT_EQ(v.content[2]["thinking"], "\n\nMore.");
}

}  // namespace
}  // namespace pd::server
