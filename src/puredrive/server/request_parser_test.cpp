// Request parsing and validation: every rejection has OpenAI's status, error shape, param and code.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "puredrive/server/chat_request.h"
#include "puredrive/server/completion_request.h"

namespace pd::server {
namespace {

using nlohmann::json;

RequestLimits limits() {
  return RequestLimits{.model_names = {"m", "m-dir"}, .vocab_size = 1000};
}

struct BadCase {
  const char* name;
  std::string body;
  int status;
  const char* param;  // nullptr: JSON null
  const char* code;   // nullptr: JSON null
  const char* message_part;
};

// A valid chat body with one field replaced (or added); null removes nothing, it sets the field to null.
std::string chat_with(const char* key, json value) {
  json j = {{"model", "m"}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  j[key] = std::move(value);
  return j.dump();
}

std::string chat_messages(json messages) {
  return chat_with("messages", std::move(messages));
}

void expect_error_shape(const ApiError& e, const BadCase& c) {
  SCOPED_TRACE(c.name);
  EXPECT_EQ(e.status, c.status) << e.message;
  const json body = json::parse(e.to_json());
  ASSERT_TRUE(body.contains("error"));
  const json& err = body["error"];
  ASSERT_EQ(err.size(), 4u) << body.dump();
  EXPECT_TRUE(err["message"].is_string());
  EXPECT_NE(err["message"].get<std::string>().find(c.message_part), std::string::npos) << err["message"];
  EXPECT_EQ(err["type"], "invalid_request_error");
  if (c.param) {
    EXPECT_EQ(err["param"], c.param);
  } else {
    EXPECT_TRUE(err["param"].is_null()) << err["param"];
  }
  if (c.code) {
    EXPECT_EQ(err["code"], c.code);
  } else {
    EXPECT_TRUE(err["code"].is_null()) << err["code"];
  }
}

TEST(ChatRequestParser, RejectsBadInputWithOpenAIErrors) {
  const json user = {{"role", "user"}, {"content", "hi"}};
  const json weather_tool = {{"type", "function"},
                             {"function", {{"name", "get_weather"}, {"parameters", {{"type", "object"}}}}}};
  std::string deep = "{\"model\":\"m\",\"x\":" + std::string(200, '[') + std::string(200, ']') + "}";
  const std::vector<BadCase> cases = {
      {"empty body", "", 400, nullptr, nullptr, "empty"},
      {"malformed json", "{\"model\": \"m\",", 400, nullptr, nullptr, "could not parse the JSON body"},
      {"trailing garbage", "{\"model\": \"m\"} x", 400, nullptr, nullptr, "could not parse"},
      {"array body", "[1,2]", 400, nullptr, nullptr, "must be a JSON object"},
      {"invalid utf-8", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}", 400,
       nullptr, nullptr, "UTF-8"},
      {"lone surrogate", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\\ud800\"}]}", 400,
       nullptr, nullptr, "UTF-8"},
      {"too deep", deep, 400, nullptr, nullptr, "nested more than"},
      {"number out of range", "{\"model\":\"m\",\"x\":1e400}", 400, nullptr, nullptr, "out of range"},
      {"negative number out of range", "{\"model\":\"m\",\"temperature\":-1e999}", 400, nullptr, nullptr,
       "out of range"},
      {"response_format type not a string", chat_with("response_format", {{"type", 1}}), 400,
       "response_format.type", "invalid_type", "expected a string"},
      {"response_format without type", chat_with("response_format", json::object()), 400,
       "response_format.type", "missing_required_parameter", "Missing required parameter"},
      {"missing model", json{{"messages", json::array({user})}}.dump(), 400, "model",
       "missing_required_parameter", "Missing required parameter: 'model'"},
      {"model wrong type", chat_with("model", 5), 400, "model", "invalid_type", "expected a string"},
      {"unknown model", chat_with("model", "gpt-4"), 404, "model", "model_not_found", "does not exist"},
      {"missing messages", json{{"model", "m"}}.dump(), 400, "messages", "missing_required_parameter",
       "messages"},
      {"messages not array", chat_messages("hi"), 400, "messages", "invalid_type", "expected an array"},
      {"messages empty", chat_messages(json::array()), 400, "messages", "empty_array",
       "at least one message"},
      {"message not object", chat_messages(json::array({"hi"})), 400, "messages[0]", "invalid_type",
       "object"},
      {"missing role", chat_messages(json::array({{{"content", "hi"}}})), 400, "messages[0].role",
       "missing_required_parameter", "role"},
      {"unknown role", chat_messages(json::array({{{"role", "robot"}, {"content", "hi"}}})), 400,
       "messages[0].role", "invalid_value", "'robot' is not a supported role"},
      {"content wrong type", chat_messages(json::array({{{"role", "user"}, {"content", 42}}})), 400,
       "messages[0].content", "invalid_type", "string or an array"},
      {"image part",
       chat_messages(json::array(
           {{{"role", "user"},
             {"content",
              json::array({{{"type", "text"}, {"text", "a"}},
                           {{"type", "image_url"}, {"image_url", {{"url", "http://x/y.png"}}}}})}}})),
       400, "messages[0].content[1].type", "unsupported_content_type", "text-only"},
      {"audio part",
       chat_messages(
           json::array({{{"role", "user"},
                         {"content", json::array({{{"type", "input_audio"},
                                                   {"input_audio", {{"data", ""}, {"format", "wav"}}}}})}}})),
       400, "messages[0].content[0].type", "unsupported_content_type", "input_audio"},
      {"unknown part",
       chat_messages(json::array({{{"role", "user"}, {"content", json::array({{{"type", "hologram"}}})}}})),
       400, "messages[0].content[0].type", "invalid_value", "unknown content part type"},
      {"text part without text",
       chat_messages(json::array({{{"role", "user"}, {"content", json::array({{{"type", "text"}}})}}})), 400,
       "messages[0].content[0].text", "missing_required_parameter", "text"},
      {"user content null", chat_messages(json::array({{{"role", "user"}, {"content", nullptr}}})), 400,
       "messages[0].content", "missing_required_parameter", "content"},
      {"tool without id", chat_messages(json::array({user, {{"role", "tool"}, {"content", "42"}}})), 400,
       "messages[1].tool_call_id", "missing_required_parameter", "tool_call_id"},
      {"tool call without name",
       chat_messages(json::array(
           {user,
            {{"role", "assistant"},
             {"tool_calls",
              json::array({{{"id", "c"}, {"type", "function"}, {"function", {{"arguments", "{}"}}}}})}}})),
       400, "messages[1].tool_calls[0].function.name", "missing_required_parameter", "name"},
      {"temperature range", chat_with("temperature", 2.5), 400, "temperature", "invalid_value",
       "between 0 and 2"},
      {"temperature type", chat_with("temperature", "hot"), 400, "temperature", "invalid_type",
       "expected a number"},
      {"top_p range", chat_with("top_p", 1.5), 400, "top_p", "invalid_value", "between 0 and 1"},
      {"top_k fraction", chat_with("top_k", 1.5), 400, "top_k", "invalid_type", "integer"},
      {"top_k below -1", chat_with("top_k", -2), 400, "top_k", "invalid_value", "between -1"},
      {"min_p range", chat_with("min_p", -0.1), 400, "min_p", "invalid_value", "between 0 and 1"},
      {"presence range", chat_with("presence_penalty", 3), 400, "presence_penalty", "invalid_value",
       "between -2 and 2"},
      {"frequency range", chat_with("frequency_penalty", -2.5), 400, "frequency_penalty", "invalid_value",
       "-2"},
      {"max_tokens zero", chat_with("max_tokens", 0), 400, "max_tokens", "invalid_value", "between 1"},
      {"max_tokens string", chat_with("max_tokens", "10"), 400, "max_tokens", "invalid_type", "integer"},
      {"max_completion_tokens negative", chat_with("max_completion_tokens", -5), 400, "max_completion_tokens",
       "invalid_value", "between 1"},
      {"n two", chat_with("n", 2), 400, "n", "unsupported_value", "n=2 is not supported"},
      {"n zero", chat_with("n", 0), 400, "n", "invalid_value", "between 1"},
      {"five stops", chat_with("stop", json::array({"a", "b", "c", "d", "e"})), 400, "stop", "invalid_value",
       "at most 4"},
      {"stop number", chat_with("stop", 7), 400, "stop", "invalid_type", "string or an array"},
      {"stop list with number", chat_with("stop", json::array({"a", 1})), 400, "stop", "invalid_type",
       "string"},
      {"seed string", chat_with("seed", "abc"), 400, "seed", "invalid_type", "integer"},
      {"logit_bias key", chat_with("logit_bias", {{"abc", 1}}), 400, "logit_bias", "invalid_value",
       "not a token id"},
      {"logit_bias id out of vocab", chat_with("logit_bias", {{"1000", 1}}), 400, "logit_bias",
       "invalid_value", "between 0 and 999"},
      {"logit_bias value", chat_with("logit_bias", {{"5", 200}}), 400, "logit_bias", "invalid_value",
       "-100 and 100"},
      {"logit_bias type", chat_with("logit_bias", json::array({1})), 400, "logit_bias", "invalid_type",
       "object"},
      {"logprobs type", chat_with("logprobs", "yes"), 400, "logprobs", "invalid_type", "boolean"},
      {"top_logprobs range", chat_with("top_logprobs", 21), 400, "top_logprobs", "invalid_value",
       "between 0 and 20"},
      {"top_logprobs without logprobs", chat_with("top_logprobs", 3), 400, "top_logprobs", "invalid_value",
       "requires 'logprobs'"},
      {"stream type", chat_with("stream", "true"), 400, "stream", "invalid_type", "boolean"},
      {"stream_options without stream", chat_with("stream_options", {{"include_usage", true}}), 400,
       "stream_options", "invalid_value", "only allowed when 'stream'"},
      {"tools not array", chat_with("tools", "x"), 400, "tools", "invalid_type", "array"},
      {"tool type", chat_with("tools", json::array({{{"type", "retrieval"}}})), 400, "tools[0].type",
       "invalid_value", "expected 'function'"},
      {"tool bad name",
       chat_with("tools", json::array({{{"type", "function"}, {"function", {{"name", "get weather"}}}}})),
       400, "tools[0].function.name", "invalid_value", "does not match"},
      {"duplicate tools", chat_with("tools", json::array({weather_tool, weather_tool})), 400,
       "tools[1].function.name", "invalid_value", "Duplicate tool name"},
      {"tool parameters type",
       chat_with("tools",
                 json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", "x"}}}}})),
       400, "tools[0].function.parameters", "invalid_type", "JSON Schema"},
      {"tool_choice word", chat_with("tool_choice", "sometimes"), 400, "tool_choice", "invalid_value",
       "sometimes"},
      {"tool_choice required without tools", chat_with("tool_choice", "required"), 400, "tool_choice",
       "invalid_value", "requires 'tools'"},
      {"unsupported response_format", chat_with("response_format", {{"type", "json_object"}}), 400,
       "response_format", "unsupported_value", "not supported"},
      {"legacy functions", chat_with("functions", json::array({{{"name", "f"}}})), 400, "functions",
       "unsupported_parameter", "deprecated"},
      {"audio output", chat_with("audio", {{"voice", "alloy"}}), 400, "audio", "unsupported_parameter",
       "Audio"},
      {"template kwargs type", chat_with("chat_template_kwargs", json::array()), 400, "chat_template_kwargs",
       "invalid_type", "object"},
      {"enable_thinking type", chat_with("chat_template_kwargs", {{"enable_thinking", "no"}}), 400,
       "chat_template_kwargs.enable_thinking", "invalid_type", "expected a boolean"},
  };
  ASSERT_GE(cases.size(), 25u);
  for (const auto& c : cases) {
    ChatRequest req;
    auto err = parse_chat_request(c.body, limits(), &req);
    ASSERT_TRUE(err.has_value()) << c.name << " was accepted";
    expect_error_shape(*err, c);
  }
}

TEST(ChatRequestParser, NamedToolChoiceMustBeAmongTools) {
  json j =
      json::parse(chat_with("tools", json::array({{{"type", "function"}, {"function", {{"name", "a"}}}}})));
  j["tool_choice"] = {{"type", "function"}, {"function", {{"name", "b"}}}};
  ChatRequest req;
  auto err = parse_chat_request(j.dump(), limits(), &req);
  ASSERT_TRUE(err);
  expect_error_shape(*err, {"named", "", 400, "tool_choice", "invalid_value", "'b' is not among"});
}

TEST(ChatRequestParser, ParsesEverySupportedField) {
  const json body = {
      {"model", "m-dir"},
      {"messages",
       json::array(
           {{{"role", "developer"}, {"content", "be brief"}},
            {{"role", "user"},
             {"content",
              json::array({{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}})}},
            {{"role", "assistant"},
             {"content", nullptr},
             {"reasoning_content", "hmm"},
             {"tool_calls", json::array({{{"id", "call_1"},
                                          {"type", "function"},
                                          {"function", {{"name", "f"}, {"arguments", "{\"x\": 1}"}}}}})}},
            {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "42"}}})},
      {"tools",
       json::array(
           {{{"type", "function"},
             {"function", {{"name", "f"}, {"description", "d"}, {"parameters", {{"type", "object"}}}}}}})},
      {"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}},
      {"stream", true},
      {"stream_options", {{"include_usage", true}}},
      {"temperature", 0.7},
      {"top_p", 0.9},
      {"top_k", 40},
      {"min_p", 0.05},
      {"presence_penalty", 0.5},
      {"frequency_penalty", -0.5},
      {"seed", 1234},
      {"logit_bias", {{"7", -100}, {"9", 2.5}}},
      {"logprobs", true},
      {"top_logprobs", 5},
      {"max_tokens", 100},
      {"max_completion_tokens", 50},
      {"stop", "END"},
      {"parallel_tool_calls", false},
      {"chat_template_kwargs", {{"enable_thinking", true}}},
      {"user", "u-1"},
      {"metadata", {{"k", "v"}}},
      {"store", false},
      {"some_vendor_extension", 1},
  };
  ChatRequest req;
  auto err = parse_chat_request(body.dump(), limits(), &req);
  ASSERT_FALSE(err) << err->message;
  EXPECT_EQ(req.common.model, "m-dir");
  ASSERT_EQ(req.prompt.messages.size(), 4u);
  EXPECT_EQ(req.prompt.messages[0].role, "system");
  EXPECT_EQ(req.prompt.messages[1].content, "ab");
  EXPECT_TRUE(req.prompt.messages[2].content_is_null);
  EXPECT_EQ(req.prompt.messages[2].reasoning_content, "hmm");
  ASSERT_EQ(req.prompt.messages[2].tool_calls.size(), 1u);
  EXPECT_EQ(req.prompt.messages[2].tool_calls[0].id, "call_1");
  EXPECT_EQ(req.prompt.messages[2].tool_calls[0].arguments, "{\"x\": 1}");
  EXPECT_EQ(req.prompt.messages[3].tool_call_id, "call_1");
  EXPECT_EQ(req.prompt.tools.size(), 1u);
  EXPECT_EQ(req.prompt.tool_choice.mode, ToolChoice::Mode::kFunction);
  EXPECT_EQ(req.prompt.tool_choice.function_name, "f");
  EXPECT_TRUE(req.common.stream);
  EXPECT_TRUE(req.common.include_usage);
  const SamplingOptions& s = req.common.sampling;
  EXPECT_FLOAT_EQ(s.temperature, 0.7f);
  EXPECT_FLOAT_EQ(s.top_p, 0.9f);
  EXPECT_EQ(s.top_k, 40);
  EXPECT_FLOAT_EQ(s.min_p, 0.05f);
  EXPECT_FLOAT_EQ(s.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(s.frequency_penalty, -0.5f);
  EXPECT_EQ(s.seed, 1234u);
  ASSERT_EQ(s.logit_bias.size(), 2u);
  EXPECT_TRUE(req.logprobs);
  EXPECT_EQ(req.top_logprobs, 5);
  EXPECT_EQ(req.common.max_tokens, 50);  // max_completion_tokens wins
  EXPECT_EQ(req.common.stop, std::vector<std::string>{"END"});
  EXPECT_FALSE(req.parallel_tool_calls);
  EXPECT_EQ(req.prompt.template_kwargs["enable_thinking"], true);
}

TEST(ChatRequestParser, NullMeansAbsentAndTopPZeroIsGreedy) {
  json j = json::parse(chat_with("temperature", nullptr));
  j["max_tokens"] = nullptr;
  j["stop"] = nullptr;
  j["top_p"] = 0;
  j["top_k"] = -1;
  j["max_tokens"] = 16.0;  // whole-number float accepted
  ChatRequest req;
  auto err = parse_chat_request(j.dump(), limits(), &req);
  ASSERT_FALSE(err) << err->message;
  EXPECT_EQ(req.common.sampling.temperature, 0.0f);
  EXPECT_EQ(req.common.sampling.top_k, 0);
  EXPECT_EQ(req.common.max_tokens, 16);
  EXPECT_TRUE(req.common.stop.empty());
}

std::string completion_with(const char* key, json value) {
  json j = {{"model", "m"}, {"prompt", "def f():"}};
  j[key] = std::move(value);
  return j.dump();
}

TEST(CompletionRequestParser, RejectsBadInputWithOpenAIErrors) {
  const std::vector<BadCase> cases = {
      {"missing prompt", json{{"model", "m"}}.dump(), 400, "prompt", "missing_required_parameter", "prompt"},
      {"prompt number", completion_with("prompt", 3), 400, "prompt", "invalid_type", "string"},
      {"prompt empty list", completion_with("prompt", json::array()), 400, "prompt", "invalid_value",
       "empty"},
      {"batched prompts", completion_with("prompt", json::array({"a", "b"})), 400, "prompt",
       "unsupported_value", "one prompt per request"},
      {"token out of vocab", completion_with("prompt", json::array({1, 2, 5000})), 400, "prompt",
       "invalid_value", "prompt[2]"},
      {"negative token", completion_with("prompt", json::array({-1})), 400, "prompt", "invalid_value",
       "token id"},
      {"suffix", completion_with("suffix", "}"), 400, "suffix", "unsupported_parameter", "suffix"},
      {"best_of", completion_with("best_of", 2), 400, "best_of", "unsupported_value", "best_of"},
      {"echo with logprobs", json{{"model", "m"}, {"prompt", "x"}, {"echo", true}, {"logprobs", 2}}.dump(),
       400, "echo", "unsupported_value", "echo"},
      {"logprobs range", completion_with("logprobs", 21), 400, "logprobs", "invalid_value",
       "between 0 and 20"},
      {"n three", completion_with("n", 3), 400, "n", "unsupported_value", "n=3"},
      {"unknown model", completion_with("model", "other"), 404, "model", "model_not_found", "other"},
  };
  for (const auto& c : cases) {
    CompletionRequest req;
    auto err = parse_completion_request(c.body, limits(), &req);
    ASSERT_TRUE(err.has_value()) << c.name << " was accepted";
    expect_error_shape(*err, c);
  }
}

// Client text quoted in errors is cut short (a 20 MB model name is not sent back whole), and what goes to
// the log cannot start a new line or send terminal sequences.
TEST(RequestErrors, EchoedInputIsBoundedAndLogsAreEscaped) {
  const std::string huge(20u << 20, 'a');
  ChatRequest req;
  auto err = parse_chat_request(chat_with("model", huge), limits(), &req);
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->status, 404);
  EXPECT_LT(err->to_json().size(), 1000u);
  EXPECT_NE(err->message.find("(20971520 bytes)"), std::string::npos) << err->message;

  ChatRequest req2;
  auto role = parse_chat_request(
      chat_messages(json::array({{{"role", "user\nE 2026 forged"}, {"content", "x"}}})), limits(), &req2);
  ASSERT_TRUE(role.has_value());
  const std::string logged = log_safe(role->message);
  EXPECT_EQ(logged.find('\n'), std::string::npos);
  EXPECT_NE(logged.find("user\\nE 2026 forged"), std::string::npos) << logged;

  EXPECT_EQ(log_safe("a\x1b[31mb\x7f\xff\xc2\x9b"), "a\\x1b[31mb\\x7f\\xff\\u009b");
  EXPECT_EQ(log_safe("caf\xc3\xa9 \xe2\x82\xac"), "caf\xc3\xa9 \xe2\x82\xac");  // valid UTF-8 stays
  // The cut never splits a character: 199 ASCII bytes, then a 2-byte character across the limit.
  const std::string cut = echo(std::string(199, 'x') + "\xc3\xa9" + std::string(10, 'y'));
  EXPECT_EQ(cut.substr(0, 203), std::string(199, 'x') + "... ");
}

TEST(CompletionRequestParser, PromptForms) {
  CompletionRequest a, b, c;
  ASSERT_FALSE(parse_completion_request(completion_with("prompt", json::array({"x"})), limits(), &a));
  EXPECT_EQ(a.prompt_text, "x");
  EXPECT_EQ(a.common.max_tokens, kCompletionDefaultMaxTokens);
  ASSERT_FALSE(parse_completion_request(completion_with("prompt", json::array({1, 2, 3})), limits(), &b));
  EXPECT_TRUE(b.prompt_is_ids);
  EXPECT_EQ(b.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  ASSERT_FALSE(
      parse_completion_request(completion_with("prompt", json::array({json::array({4, 5})})), limits(), &c));
  EXPECT_EQ(c.prompt_ids, (std::vector<int32_t>{4, 5}));
}

}  // namespace
}  // namespace pd::server
