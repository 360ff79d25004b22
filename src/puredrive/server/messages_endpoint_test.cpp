// POST /v1/messages and /v1/messages/count_tokens through ApiService with the fake engine and frontend:
// message shapes, stop reasons, tools both ways, thinking, the stream's event sequence, and errors in
// Anthropic's shape (queue full, engine stopping mid-stream). Expected texts follow from what the fake engine
// writes (testing/fake_engine.h) and its byte-level tokenizer: one token per byte, one per special token.
#include <gtest/gtest.h>

#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "puredrive/server/api_service.h"
#include "puredrive/server/testing/fake_engine.h"
#include "puredrive/server/testing/fake_frontend.h"
#include "puredrive/server/testing/test_engines.h"

namespace pd::server {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

class Recorder final : public ClientConnection {
 public:
  bool write(std::string_view data) override {
    std::lock_guard l(mu_);
    data_ += data;
    return true;
  }
  bool alive() override { return true; }
  std::string data() const {
    std::lock_guard l(mu_);
    return data_;
  }

 private:
  mutable std::mutex mu_;
  std::string data_;
};

ServiceOptions service_options(std::string model) {
  ServiceOptions o;
  o.model_names = {std::move(model)};
  o.poll_interval = 5ms;
  return o;
}

struct FakeService {
  fake::FakeEngine engine{fake::FakeEngineOptions{}};
  Metrics metrics;
  Scheduler scheduler{engine, 4, &metrics};
  ApiService service{service_options("fake"), scheduler, engine.info(), fake::make_fake_frontend(), metrics};
  ~FakeService() { scheduler.shutdown(); }

  Reply post(const json& body) {
    Recorder client;
    return service.messages(body.dump(), client);
  }
  json post_json(const json& body, int status = 200) {
    const Reply r = post(body);
    EXPECT_EQ(r.status, status) << r.body;
    EXPECT_FALSE(r.stream);
    return json::parse(r.body);
  }
  // The whole SSE body of a streaming request.
  std::string stream(const json& body) {
    Reply r = post(body);
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.content_type, "text/event-stream");
    if (!r.stream) return "";
    Recorder client;
    r.stream(client);
    return client.data();
  }
};

// "event: NAME\ndata: JSON\n\n" frames; every event's name must be its data's type.
std::vector<json> parse_events(const std::string& sse) {
  std::vector<json> events;
  size_t pos = 0;
  while (pos < sse.size()) {
    const size_t end = sse.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated frame";
    if (end == std::string::npos) break;
    const std::string frame = sse.substr(pos, end - pos);
    pos = end + 2;
    const size_t nl = frame.find('\n');
    EXPECT_EQ(frame.rfind("event: ", 0), 0u) << frame;
    EXPECT_EQ(frame.compare(nl + 1, 6, "data: "), 0) << frame;
    json e = json::parse(frame.substr(nl + 7));
    EXPECT_EQ(frame.substr(7, nl - 7), e["type"].get<std::string>());
    events.push_back(std::move(e));
  }
  return events;
}

json user(const std::string& text) {
  return {{"role", "user"}, {"content", text}};
}

json request(std::vector<json> messages, int max_tokens = 400) {
  return {{"model", "fake"}, {"max_tokens", max_tokens}, {"temperature", 0}, {"messages", messages}};
}

const json kWeatherTool = {
    {"name", "get_weather"},
    {"input_schema", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}};

// The fake prompt of one user turn: <|im_start|>user\nTEXT<|im_end|>\n<|im_start|>assistant\n.
int32_t one_turn_prompt_tokens(const std::string& text) {
  return static_cast<int32_t>(3 + std::string("user\n").size() + text.size() + 1 +
                              std::string("assistant\n").size());
}

TEST(MessagesEndpoint, TextMessage) {
  FakeService s;
  const json m = s.post_json(request({user("hello")}));
  EXPECT_EQ(m["id"].get<std::string>().rfind("msg_", 0), 0u);
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["model"], "fake");
  ASSERT_EQ(m["content"].size(), 1u);
  EXPECT_EQ(m["content"][0]["type"], "text");
  const std::string text = m["content"][0]["text"];
  EXPECT_EQ(text.rfind("You said: hello", 0), 0u) << text;
  EXPECT_EQ(m["stop_reason"], "end_turn");
  EXPECT_TRUE(m["stop_sequence"].is_null());
  EXPECT_EQ(m["usage"]["input_tokens"], one_turn_prompt_tokens("hello"));
  EXPECT_EQ(m["usage"]["output_tokens"], text.size() + 1);  // the text's bytes and the end-of-turn token
  EXPECT_EQ(m["usage"]["cache_read_input_tokens"], 0);

  const Reply count = s.service.count_message_tokens(
      json{{"model", "fake"}, {"messages", json::array({user("hello")})}}.dump());
  EXPECT_EQ(count.status, 200);
  EXPECT_EQ(json::parse(count.body), json({{"input_tokens", one_turn_prompt_tokens("hello")}}));
}

TEST(MessagesEndpoint, MaxTokensAndStopSequences) {
  FakeService s;
  const json capped = s.post_json(request({user("hello")}, 5));
  EXPECT_EQ(capped["content"][0]["text"], "You s");
  EXPECT_EQ(capped["stop_reason"], "max_tokens");
  EXPECT_EQ(capped["usage"]["output_tokens"], 5);

  json stop = request({user("hello")});
  stop["stop_sequences"] = {"zzz", "said"};
  const json stopped = s.post_json(stop);
  EXPECT_EQ(stopped["content"][0]["text"], "You ");
  EXPECT_EQ(stopped["stop_reason"], "stop_sequence");
  EXPECT_EQ(stopped["stop_sequence"], "said");
}

TEST(MessagesEndpoint, ToolUseAndToolResultRoundTrip) {
  FakeService s;
  json first = request({user("Call get_weather please")});
  first["tools"] = {kWeatherTool};
  const json m = s.post_json(first);
  EXPECT_EQ(m["stop_reason"], "tool_use");
  ASSERT_EQ(m["content"].size(), 1u);
  const json& call = m["content"][0];
  EXPECT_EQ(call["type"], "tool_use");
  EXPECT_EQ(call["id"].get<std::string>().rfind("toolu_", 0), 0u);
  EXPECT_EQ(call["name"], "get_weather");
  EXPECT_EQ(call["input"], json({{"city", "Paris"}}));

  json second = request({user("Call get_weather please"),
                         {{"role", "assistant"}, {"content", m["content"]}},
                         {{"role", "user"},
                          {"content", json::array({{{"type", "tool_result"},
                                                    {"tool_use_id", call["id"]},
                                                    {"content", "sunny, 21 C"}}})}}});
  second["tools"] = {kWeatherTool};
  const json answer = s.post_json(second);
  EXPECT_EQ(answer["content"][0]["text"], "The tool said: sunny, 21 C");
  EXPECT_EQ(answer["stop_reason"], "end_turn");

  // tool_choice none: no tools rendered, no calls parsed.
  first["tool_choice"] = {{"type", "none"}};
  const json plain = s.post_json(first);
  EXPECT_EQ(plain["content"][0]["type"], "text");
  EXPECT_EQ(plain["stop_reason"], "end_turn");
}

TEST(MessagesEndpoint, ThinkingParameterSwitchesTheTemplate) {
  FakeService s;
  json on = request({user("hello")}, 2000);
  on["thinking"] = {{"type", "enabled"}, {"budget_tokens", 1024}};
  const json m = s.post_json(on);
  ASSERT_EQ(m["content"].size(), 2u);
  EXPECT_EQ(m["content"][0],
            json({{"type", "thinking"}, {"thinking", "The user wrote 5 bytes."}, {"signature", ""}}));
  EXPECT_EQ(m["content"][1]["text"].get<std::string>().rfind("You said: hello", 0), 0u);
  on["thinking"] = {{"type", "disabled"}};
  const json off = s.post_json(on);
  ASSERT_EQ(off["content"].size(), 1u);
  EXPECT_EQ(off["content"][0]["type"], "text");
}

TEST(MessagesEndpoint, StreamEventsAddUpToTheMessage) {
  FakeService s;
  json body = request({user("Call get_weather please")}, 2000);
  body["tools"] = {kWeatherTool};
  body["thinking"] = {{"type", "enabled"}, {"budget_tokens", 1024}};
  const json full = s.post_json(body);
  body["stream"] = true;
  const std::vector<json> events = parse_events(s.stream(body));
  ASSERT_GE(events.size(), 8u);
  EXPECT_EQ(events[0]["type"], "message_start");
  const json& start = events[0]["message"];
  EXPECT_EQ(start["id"].get<std::string>().rfind("msg_", 0), 0u);
  EXPECT_EQ(start["content"], json::array());
  EXPECT_TRUE(start["stop_reason"].is_null());
  EXPECT_EQ(start["usage"]["input_tokens"], full["usage"]["input_tokens"]);
  EXPECT_EQ(events[1], json({{"type", "ping"}}));
  EXPECT_EQ(events[events.size() - 2]["type"], "message_delta");
  EXPECT_EQ(events[events.size() - 2]["delta"],
            json({{"stop_reason", "tool_use"}, {"stop_sequence", nullptr}}));
  EXPECT_EQ(events[events.size() - 2]["usage"], full["usage"]);
  EXPECT_EQ(events.back(), json({{"type", "message_stop"}}));

  // The blocks, accumulated like the SDK does, are the non-streaming content (tool ids aside).
  json blocks = json::array();
  std::vector<std::string> args;
  for (size_t i = 2; i + 2 < events.size(); ++i) {
    const json& e = events[i];
    if (e["type"] == "content_block_start") {
      ASSERT_EQ(e["index"], blocks.size());
      blocks.push_back(e["content_block"]);
      args.emplace_back();
    } else if (e["type"] == "content_block_delta") {
      json& b = blocks[e["index"].get<size_t>()];
      const json& d = e["delta"];
      if (d["type"] == "thinking_delta")
        b["thinking"] = b["thinking"].get<std::string>() + d["thinking"].get<std::string>();
      if (d["type"] == "text_delta") b["text"] = b["text"].get<std::string>() + d["text"].get<std::string>();
      if (d["type"] == "input_json_delta")
        args[e["index"].get<size_t>()] += d["partial_json"].get<std::string>();
    } else {
      ASSERT_EQ(e["type"], "content_block_stop") << e.dump();
      const size_t i_block = e["index"];
      if (blocks[i_block]["type"] == "tool_use") blocks[i_block]["input"] = json::parse(args[i_block]);
    }
  }
  ASSERT_EQ(blocks.size(), full["content"].size());
  ASSERT_EQ(blocks.size(), 2u);
  EXPECT_EQ(blocks[0], full["content"][0]);
  blocks[1]["id"] = full["content"][1]["id"];
  EXPECT_EQ(blocks[1], full["content"][1]);
}

TEST(MessagesEndpoint, ErrorsHaveAnthropicsShape) {
  FakeService s;
  auto expect_error = [&](const json& body, int status, const char* type, const char* message_part) {
    const Reply r = s.post(body);
    EXPECT_EQ(r.status, status) << r.body;
    const json j = json::parse(r.body);
    EXPECT_EQ(j["type"], "error");
    EXPECT_EQ(j["error"]["type"], type) << r.body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(message_part), std::string::npos) << r.body;
  };
  json no_max = request({user("hi")});
  no_max.erase("max_tokens");
  expect_error(no_max, 400, "invalid_request_error", "max_tokens");
  json other_model = request({user("hi")});
  other_model["model"] = "claude-sonnet";
  expect_error(other_model, 404, "not_found_error", "does not exist");
  expect_error(request({user(std::string(5000, 'x'))}), 400, "invalid_request_error",
               "maximum context length");
  // Only a tool result, no user turn: the (fake) template refuses the conversation.
  expect_error(request({{{"role", "user"},
                         {"content", json::array({{{"type", "tool_result"}, {"tool_use_id", "t"}}})}}}),
               400, "invalid_request_error", "no user message");
  const Reply count = s.service.count_message_tokens("{\"model\": \"fake\"}");
  EXPECT_EQ(count.status, 400);
  EXPECT_EQ(json::parse(count.body)["error"]["type"], "invalid_request_error");
  // The OpenAI endpoints keep OpenAI's shape.
  Recorder c;
  const Reply openai = s.service.chat_completions("{}", c);
  EXPECT_TRUE(json::parse(openai.body)["error"].contains("code"));
}

TEST(MessagesEndpoint, FullQueueIsOverloaded529) {
  testing::GatedEngine engine({"Hello"});
  Metrics metrics;
  Scheduler scheduler(engine, 0, &metrics);  // no room to wait: every request is refused
  ApiService service(service_options("m"), scheduler, engine.info(), fake::make_fake_frontend(), metrics);
  Recorder c;
  json body = request({user("hi")});
  body["model"] = "m";
  const Reply r = service.messages(body.dump(), c);
  EXPECT_EQ(r.status, 529);
  EXPECT_EQ(json::parse(r.body)["error"]["type"], "overloaded_error");
  bool retry_after = false;
  for (const auto& [k, v] : r.headers) retry_after = retry_after || k == "Retry-After";
  EXPECT_TRUE(retry_after);
  scheduler.shutdown();
}

TEST(MessagesEndpoint, EngineStoppingMidStreamEndsWithAnErrorEvent) {
  testing::GatedEngine engine({"Hello", " world"});
  Metrics metrics;
  Scheduler scheduler(engine, 4, &metrics);
  ApiService service(service_options("m"), scheduler, engine.info(), fake::make_fake_frontend(), metrics);
  engine.close_gate(1);  // after the first token
  json body = request({user("hi")});
  body["model"] = "m";
  body["stream"] = true;
  Recorder client;
  Reply r = service.messages(body.dump(), client);
  ASSERT_TRUE(r.stream);
  std::thread streaming([&] { r.stream(client); });
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (client.data().find("text_delta") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(2ms);
  }
  scheduler.shutdown();  // cancels the running request
  streaming.join();
  const std::vector<json> events = parse_events(client.data());
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["type"], "error");
  EXPECT_EQ(events.back()["error"]["type"], "overloaded_error");
  for (const auto& e : events) EXPECT_NE(e["type"], "message_stop");
}

}  // namespace
}  // namespace pd::server
