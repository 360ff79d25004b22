// `puredrive generate` with text on the bundled tiny coder: MTP on == off for greedy and seeded sampling
// through the CLI, text equal to the tokenizer's decode of the ids, stop strings (text ends before the
// first occurrence, finish "stop"), --stream printing the same text, --chat rendering the chat template,
// --stats reporting acceptance.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "puredrive/chat/chat_template.h"
#include "puredrive/tokenizer/tokenizer.h"

namespace pd {
namespace {

using test::CliRun;

CliRun run(const std::string& args, bool with_stderr = false) {
  return test::run_cli(args, with_stderr);
}

const std::string kModel = std::string(PD_SOURCE_DIR) + "/models/tiny-coder";
const std::string kPrompt = "'def read_config(path):\\n    '";

nlohmann::json run_json(const std::string& flags) {
  const CliRun r = run(fmt::format("generate --model {} --threads 1 --json {}", kModel, flags));
  EXPECT_EQ(r.rc, 0) << flags << "\n" << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.out;
  return j;
}

TEST(GenerateText, MtpOnEqualsOffAndTextIsTheDecode) {
  Expected<Tokenizer> tok = Tokenizer::load(kModel);
  ASSERT_TRUE(tok.has_value());
  for (const std::string& sampling :
       {std::string("--temp 0"), std::string("--temp 0.8 --top-p 0.9 --seed 3")}) {
    const nlohmann::json off =
        run_json(fmt::format("--prompt {} -n 60 --ignore-eos {} --no-mtp", kPrompt, sampling));
    const nlohmann::json on =
        run_json(fmt::format("--prompt {} -n 60 --ignore-eos {} --mtp-draft 3", kPrompt, sampling));
    const auto ids = off.at("tokens").get<std::vector<int32_t>>();
    EXPECT_EQ(ids.size(), 60u);
    EXPECT_EQ(on.at("tokens"), off.at("tokens")) << sampling;
    EXPECT_EQ(on.at("text"), off.at("text"));
    EXPECT_EQ(off.at("text").get<std::string>(), tok->decode(ids));
    EXPECT_GT(on.at("stats").at("accepted").get<int64_t>(), 0)
        << "the trained MTP head should be accepted sometimes";
    EXPECT_EQ(on.at("mtp_draft"), 3);
    EXPECT_EQ(off.at("stats").at("cycles"), 0);
  }
}

TEST(GenerateText, StopStringEndsTheTextBeforeIt) {
  const nlohmann::json full = run_json(fmt::format("--prompt {} -n 60 --ignore-eos --temp 0", kPrompt));
  const std::string text = full.at("text").get<std::string>();
  ASSERT_GT(text.size(), 40u);
  // A stop string taken from the middle of the text (printable, no quotes).
  std::string stop;
  for (size_t i = 20; i + 3 < text.size() && stop.empty(); ++i) {
    const std::string s = text.substr(i, 3);
    if (s.find_first_of("\"'\\\n`$") == std::string::npos) stop = s;
  }
  ASSERT_FALSE(stop.empty());
  const nlohmann::json cut =
      run_json(fmt::format("--prompt {} -n 60 --ignore-eos --temp 0 --stop \"{}\"", kPrompt, stop));
  EXPECT_EQ(cut.at("finish_reason"), "stop");
  EXPECT_EQ(cut.at("text").get<std::string>(), text.substr(0, text.find(stop)))
      << "stop string '" << stop << "'";
}

TEST(GenerateText, StreamPrintsTheSameText) {
  const nlohmann::json j = run_json(fmt::format("--prompt {} -n 40 --ignore-eos --temp 0", kPrompt));
  const CliRun streamed = run(fmt::format(
      "generate --model {} --threads 1 --prompt {} -n 40 --ignore-eos --temp 0 --stream", kModel, kPrompt));
  ASSERT_EQ(streamed.rc, 0);
  EXPECT_EQ(streamed.out, j.at("text").get<std::string>() + "\n");
}

TEST(GenerateText, ChatUsesTheTemplateWithAGenerationPrompt) {
  Expected<chat::ChatTemplate> tmpl = chat::ChatTemplate::load(kModel);
  ASSERT_TRUE(tmpl.has_value()) << tmpl.status().to_string();
  chat::ChatInputs in;
  in.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "Reverse a list."}}});
  in.add_generation_prompt = true;
  Expected<std::string> rendered = tmpl->render(in);
  ASSERT_TRUE(rendered.has_value());
  Expected<Tokenizer> tok = Tokenizer::load(kModel);
  ASSERT_TRUE(tok.has_value());
  const Expected<std::vector<int32_t>> ids = tok->encode(*rendered, false);
  ASSERT_TRUE(ids.has_value());
  const nlohmann::json j = run_json("--chat 'Reverse a list.' -n 8 --temp 0");
  EXPECT_EQ(j.at("prompt_tokens").get<size_t>(), ids->size());
}

TEST(GenerateText, StatsReportAcceptance) {
  const CliRun r =
      run(fmt::format("generate --model {} --threads 1 --prompt {} -n 30 --temp 0 --stats", kModel, kPrompt),
          true);
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("tokens/cycle"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("per position"), std::string::npos) << r.out;
  // Where the decode time went: drafting, verify steps, plain steps, the sample op.
  for (const char* part : {"draft ", "verify ", "plain steps ", "sample "}) {
    EXPECT_NE(r.out.find(part), std::string::npos) << part << " missing: " << r.out;
  }
}

TEST(GenerateText, BadFlagsAreErrors) {
  EXPECT_EQ(run(fmt::format("generate --model {} --prompt x --accept seeded --temp 1", kModel)).rc, 1);
  EXPECT_EQ(run(fmt::format("generate --model {} --prompt x --accept greedy --temp 1", kModel)).rc, 1);
  EXPECT_NE(run(fmt::format("generate --model {} --prompt x --prompt-ids 1", kModel)).rc, 0)
      << "mutually exclusive prompt flags";
}

}  // namespace
}  // namespace pd
