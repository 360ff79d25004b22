// ModelPromptBuilder / ModelOutputParser on a real tokenizer (Qwen3, tests/data) and published chat
// templates. The prompts of tests/templates/conversations.json, sent as OpenAI request bodies through the
// request parser, must tokenize exactly like the text transformers rendered for them
// (tests/templates/expected/, an independent Python reference).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "puredrive/server/chat_request.h"
#include "puredrive/server/model_frontend.h"

namespace pd::server {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// tests/data: the templates as committed, the tokenizer as unpacked by the build (tests/data/CMakeLists.txt).
const std::string kQwen3Dir = std::string(PD_TEST_DATA_DIR) + "/qwen3";
const std::string kTemplateDir = std::string(PD_SOURCE_DIR) + "/tests/data/templates";

std::string read(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A model directory with the Qwen3 tokenizer and the given chat template.
class ModelDir {
 public:
  explicit ModelDir(const std::string& template_file) {
    dir_ = fs::temp_directory_path() / ("pd_frontend_" + std::to_string(::getpid()) + "_" + template_file);
    fs::create_directories(dir_);
    fs::copy_file(kQwen3Dir + "/tokenizer.json", dir_ / "tokenizer.json",
                  fs::copy_options::overwrite_existing);
    fs::copy_file(kQwen3Dir + "/tokenizer_config.json", dir_ / "tokenizer_config.json",
                  fs::copy_options::overwrite_existing);
    fs::copy_file(kTemplateDir + "/" + template_file, dir_ / "chat_template.jinja",
                  fs::copy_options::overwrite_existing);
  }
  ~ModelDir() { fs::remove_all(dir_); }
  std::string path() const { return dir_.string(); }

 private:
  fs::path dir_;
};

bool have_data() {
  return fs::exists(kQwen3Dir + "/tokenizer.json") && fs::exists(kTemplateDir);
}

// Missing test data is a failure, never a skip: it is part of the repository.
#define REQUIRE_DATA() \
  if (!have_data()) FAIL() << kQwen3Dir << " or " << kTemplateDir << " missing (rerun cmake)"

// The builder over the directory's own tokenizer, stopping at <|im_end|> (the Qwen3 eos_token).
Expected<std::shared_ptr<ModelPromptBuilder>> load_builder(const std::string& dir, int32_t vocab_limit) {
  PD_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::load(dir));
  const std::optional<int32_t> im_end = tokenizer.token_to_id("<|im_end|>");
  if (!im_end) return make_error(ErrorCode::kNotFound, "{}: no <|im_end|> token", dir);
  return ModelPromptBuilder::load(dir, std::move(tokenizer), {*im_end}, vocab_limit);
}

RequestLimits frontend_limits() {
  return RequestLimits{.model_names = {"m"}, .vocab_size = 151669};
}

void compare_with_reference(const std::string& template_file) {
  ModelDir dir(template_file);
  auto builder = load_builder(dir.path(), 0);
  ASSERT_TRUE(builder.has_value()) << builder.status().message();
  // Ordered, like a client's request body: tool schemas keep their key order into the template.
  using ojson = nlohmann::ordered_json;
  const ojson conversations =
      ojson::parse(read(PD_SOURCE_DIR "/tests/templates/conversations.json"))["conversations"];
  const std::string stem = fs::path(template_file).stem().string();
  const json expected =
      json::parse(read(PD_SOURCE_DIR "/tests/templates/expected/" + stem + ".json"))["results"];
  int compared = 0;
  for (const ojson& c : conversations) {
    const std::string name = c["name"];
    if (!c["add_generation_prompt"].get<bool>() || !expected.contains(name) ||
        !expected[name].contains("output"))
      continue;
    ojson body = {{"model", "m"}, {"messages", c["messages"]}, {"chat_template_kwargs", c["kwargs"]}};
    if (!c["tools"].is_null()) body["tools"] = c["tools"];
    ChatRequest req;
    if (auto err = parse_chat_request(body.dump(), frontend_limits(), &req))
      continue;  // e.g. image parts: refused by design
    auto prompt = (*builder)->render_chat(req.prompt);
    ASSERT_TRUE(prompt.has_value()) << name << ": " << prompt.status().message();
    auto want = (*builder)->tokenizer().encode(expected[name]["output"].get<std::string>(), false);
    ASSERT_TRUE(want.has_value());
    EXPECT_EQ(prompt->ids, *want) << template_file << " / " << name << "\nwe rendered:\n"
                                  << (*builder)->tokenizer().decode(prompt->ids) << "\nreference:\n"
                                  << expected[name]["output"].get<std::string>();
    ++compared;
  }
  EXPECT_GE(compared, 15) << "too few conversations compared for " << template_file;
}

TEST(ModelPromptBuilder, MatchesTransformersQwen35) {
  REQUIRE_DATA();
  compare_with_reference("Qwen3.5-4B.jinja");
}

TEST(ModelPromptBuilder, MatchesTransformersQwen3) {
  REQUIRE_DATA();
  compare_with_reference("Qwen-Qwen3-0.6B.jinja");
}

TEST(ModelPromptBuilder, MatchesTransformersQwen3Coder) {
  REQUIRE_DATA();
  compare_with_reference("Qwen3-Coder.jinja");
}

const json kWeather = {
    {"type", "function"},
    {"function",
     {{"name", "get_weather"},
      {"parameters",
       {{"type", "object"},
        {"properties", {{"city", {{"type", "string"}}}, {"days", {{"type", "integer"}}}}}}}}}};

ChatRequest request_with(const json& extra) {
  json body = {{"model", "m"},
               {"messages", json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}})},
               {"tools", json::array({kWeather})}};
  body.update(extra);
  ChatRequest req;
  auto err = parse_chat_request(body.dump(), frontend_limits(), &req);
  EXPECT_FALSE(err) << err->message;
  return req;
}

TEST(ModelPromptBuilder, ForcedToolChoiceOpensTheCallInTheTemplatesMarkup) {
  REQUIRE_DATA();
  {
    ModelDir dir("Qwen3.5-4B.jinja");
    auto b = load_builder(dir.path(), 0);
    ASSERT_TRUE(b.has_value()) << b.status().message();
    EXPECT_EQ((*b)->tool_markup(), ToolMarkup::kXml);
    auto named = (*b)->render_chat(
        request_with({{"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}})
            .prompt);
    ASSERT_TRUE(named.has_value());
    const std::string text = (*b)->tokenizer().decode(named->ids);
    // Qwen3.5 opens <think> in the generation prompt; a forced call closes it first.
    EXPECT_TRUE(
        text.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n<function=get_weather>\n"))
        << text;
    EXPECT_EQ(named->assistant_prefix, "<tool_call>\n<function=get_weather>\n");
    EXPECT_FALSE(named->starts_in_reasoning);
    auto required = (*b)->render_chat(request_with({{"tool_choice", "required"}}).prompt);
    EXPECT_TRUE((*b)->tokenizer().decode(required->ids).ends_with("</think>\n\n<tool_call>\n"));
    auto none = (*b)->render_chat(request_with({{"tool_choice", "none"}}).prompt);
    EXPECT_EQ((*b)->tokenizer().decode(none->ids).find("<tools>"), std::string::npos);
    auto plain = (*b)->render_chat(request_with(json::object()).prompt);
    EXPECT_TRUE(plain->starts_in_reasoning);
    EXPECT_NE((*b)->tokenizer().decode(plain->ids).find("<tools>"), std::string::npos);
  }
  {
    ModelDir dir("Qwen-Qwen3-0.6B.jinja");
    auto b = load_builder(dir.path(), 0);
    ASSERT_TRUE(b.has_value());
    EXPECT_EQ((*b)->tool_markup(), ToolMarkup::kJson);
    auto named = (*b)->render_chat(
        request_with({{"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}})
            .prompt);
    EXPECT_TRUE(
        (*b)->tokenizer()
            .decode(named->ids)
            .ends_with("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "));
  }
}

TEST(ModelPromptBuilder, StopIdsAndCompletionTokens) {
  REQUIRE_DATA();
  ModelDir dir("Qwen3.5-4B.jinja");
  auto b = load_builder(dir.path(), 0);
  ASSERT_TRUE(b.has_value());
  const auto im_end = (*b)->tokenizer().token_to_id("<|im_end|>");
  ASSERT_TRUE(im_end.has_value());
  EXPECT_EQ((*b)->stop_token_ids(), std::vector<int32_t>{*im_end});
  auto t = (*b)->tokenize("def f():<|im_end|>");
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->ids.back(), *im_end);  // special tokens in completion prompts are recognised
  EXPECT_EQ((*b)->detokenize(t->ids), "def f():<|im_end|>");
  auto capped = load_builder(dir.path(), 1000);
  EXPECT_EQ((*capped)->vocab_size(), 1000);
  // Without an end-of-sequence id generation could not stop: refused, naming the directory.
  auto tokenizer = Tokenizer::load(dir.path());
  ASSERT_TRUE(tokenizer.has_value());
  auto no_stop = ModelPromptBuilder::load(dir.path(), std::move(*tokenizer), {}, 0);
  ASSERT_FALSE(no_stop.has_value());
  EXPECT_NE(no_stop.status().message().find(dir.path() + ": no end-of-sequence token"), std::string::npos)
      << no_stop.status().message();
}

TEST(ModelOutputParser, ForcedCallPrefixAndStreamingParse) {
  PromptTokens prompt;
  prompt.assistant_prefix = "<tool_call>\n<function=get_weather>\n";
  ParseOptions options;
  options.tools = true;
  options.tools_json = nlohmann::ordered_json::array({nlohmann::ordered_json::parse(kWeather.dump())});
  ModelOutputParser parser;
  auto turn = parser.start_turn(options, prompt);
  const std::string generated =
      "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
  for (char c : generated) turn->feed(std::string(1, c));
  const ParsedOutput& out = turn->finish();
  ASSERT_EQ(out.tool_calls.size(), 1u);
  EXPECT_EQ(out.tool_calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(out.tool_calls[0].arguments), json({{"city", "Paris"}, {"days", 3}}));
  EXPECT_EQ(out.content, "");

  PromptTokens thinking;
  thinking.starts_in_reasoning = true;
  auto t2 = parser.start_turn(ParseOptions{}, thinking);
  t2->feed("Let me think.\n</think>\n\nHello");
  const ParsedOutput& o2 = t2->finish();
  EXPECT_EQ(o2.reasoning_content, "Let me think.");
  EXPECT_EQ(o2.content, "Hello");

  // A call written before the reasoning closed (and the turn ended there) is still a call, streamed or not.
  const std::string in_reasoning =
      "I need the weather.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
      "</function>\n</tool_call>";
  auto t3 = parser.start_turn(options, thinking);
  for (char c : in_reasoning) t3->feed(std::string(1, c));
  const ParsedOutput& o3 = t3->finish();
  EXPECT_EQ(o3.reasoning_content, "I need the weather.");
  ASSERT_EQ(o3.tool_calls.size(), 1u);
  EXPECT_EQ(json::parse(o3.tool_calls[0].arguments), json({{"city", "Paris"}}));
}

}  // namespace
}  // namespace pd::server
