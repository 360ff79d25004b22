// Every chat template of tests/data/templates rendered for every conversation of
// tests/templates/conversations.json must be byte-identical to transformers' apply_chat_template (or fail
// where it raised). Expected outputs: tests/templates/expected/*.json
// (tools/reference/templates/make_reference.py).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "puredrive/chat/chat_template.h"

namespace pd::chat {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

const fs::path kRefDir = fs::path(PD_SOURCE_DIR) / "tests" / "templates";
const fs::path kTemplateDir = fs::path(PD_SOURCE_DIR) / "tests" / "data" / "templates";

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string fnv1a64(const std::string& data) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : data) h = (h ^ c) * 0x100000001B3ull;
  return fmt::format("{:016x}", h);
}

jinja::RenderOptions reference_options() {
  jinja::RenderOptions o;
  o.fixed_now = *jinja::parse_fixed_date("2025-07-26T10:30:05");
  return o;
}

ChatInputs inputs_of(const ojson& conv) {
  ChatInputs in;
  in.messages = conv.at("messages");
  in.tools = conv.at("tools");
  in.add_generation_prompt = conv.at("add_generation_prompt").get<bool>();
  in.extra = conv.at("kwargs");
  return in;
}

class ChatTemplateGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplateGolden, MatchesTransformers) {
  const ojson expected = ojson::parse(read_file(kRefDir / "expected" / GetParam()));
  const fs::path template_path = kTemplateDir / expected.at("template_file").get<std::string>();
  ASSERT_TRUE(fs::exists(template_path)) << "chat template " << template_path << " not found";
  const std::string source = read_file(template_path);
  ASSERT_EQ(fnv1a64(source), expected.at("template_fnv1a64").get<std::string>())
      << template_path << " differs from the file the reference was generated from; rerun make_reference.py";
  auto tmpl =
      ChatTemplate::from_source(source, expected.at("special_tokens"), template_path.filename().string());
  ASSERT_TRUE(tmpl.has_value()) << tmpl.status().message();

  const ojson conversations = ojson::parse(read_file(kRefDir / "conversations.json")).at("conversations");
  ASSERT_GE(conversations.size(), 30u);
  const ojson& results = expected.at("results");
  for (const auto& conv : conversations) {
    const std::string name = conv.at("name").get<std::string>();
    SCOPED_TRACE("conversation " + name);
    ASSERT_TRUE(results.contains(name)) << "no reference result; rerun make_reference.py";
    const ojson& want = results.at(name);
    auto out = tmpl->render(inputs_of(conv), reference_options());
    if (want.contains("output")) {
      ASSERT_TRUE(out.has_value()) << out.status().message();
      EXPECT_EQ(*out, want.at("output").get<std::string>());
    } else {
      const std::string type = want.at("error").at("type").get<std::string>();
      const std::string message = want.at("error").at("message").get<std::string>();
      ASSERT_FALSE(out.has_value()) << "transformers raised " << type << ": " << message << "\nwe rendered:\n"
                                    << *out;
      if (type != "RecursionError") {
        EXPECT_NE(out.status().message().find(message), std::string::npos)
            << "transformers: " << type << ": " << message << "\nours: " << out.status().message();
      }
    }
  }
}

std::vector<std::string> reference_files() {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(kRefDir / "expected")) {
    if (entry.path().extension() == ".json") names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

INSTANTIATE_TEST_SUITE_P(AllTemplates, ChatTemplateGolden, ::testing::ValuesIn(reference_files()),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           std::string n = param.param.substr(0, param.param.size() - 5);
                           for (char& c : n) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return n;
                         });

// The committed templates and the reference files correspond one to one, so no template goes untested.
TEST(ChatTemplateGoldenData, EveryTemplateHasAReference) {
  std::vector<std::string> templates;
  for (const auto& entry : fs::directory_iterator(kTemplateDir)) {
    if (entry.path().extension() == ".jinja") templates.push_back(entry.path().filename().string());
  }
  std::sort(templates.begin(), templates.end());
  std::vector<std::string> referenced;
  for (const auto& name : reference_files()) {
    referenced.push_back(
        ojson::parse(read_file(kRefDir / "expected" / name)).at("template_file").get<std::string>());
  }
  std::sort(referenced.begin(), referenced.end());
  EXPECT_EQ(templates.size(), 9u);
  EXPECT_EQ(templates, referenced);
}

TEST(ChatTemplatePerformance, TypicalChatRendersFast) {
  const fs::path path = kTemplateDir / "Qwen3.5-4B.jinja";
  ASSERT_TRUE(fs::exists(path)) << path << " not found";
  auto tmpl = ChatTemplate::from_source(read_file(path), ojson{{"eos_token", "<|im_end|>"}});
  ASSERT_TRUE(tmpl.has_value()) << tmpl.status().message();
  const ojson conversations = ojson::parse(read_file(kRefDir / "conversations.json")).at("conversations");
  ChatInputs in;
  for (const auto& conv : conversations) {
    if (conv.at("name") == "tool_call_parallel") in = inputs_of(conv);
  }
  ASSERT_FALSE(in.messages.empty());
  const auto options = reference_options();
  ASSERT_TRUE(tmpl->render(in, options).has_value());
  constexpr int kRuns = 200;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRuns; ++i) ASSERT_TRUE(tmpl->render(in, options).has_value());
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / kRuns;
  std::printf("Qwen3.5 template, 7 messages + 1 tool: %.1f us per render\n", us);
  // Generous bound so sanitizer builds pass; RelWithDebInfo is far below it.
  EXPECT_LT(us, 20000.0);
}

}  // namespace
}  // namespace pd::chat
