// Bad and unsupported inputs: every failure is a Status naming the file, field and what was found.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "puredrive/tokenizer/test_data.h"
#include "puredrive/tokenizer/tokenizer.h"

namespace pd {
namespace {

nlohmann::json base_tokenizer() {
  return tok::testing::read_json(tok::testing::reference_dir() +
                                 "/features/added_token_flags.json")["tokenizer"];
}

void expect_error(const nlohmann::json& j, ErrorCode code, const std::vector<std::string>& needles) {
  auto t = Tokenizer::from_json(j.dump(), "", "bad/tokenizer.json");
  ASSERT_FALSE(t.has_value()) << "loaded: " << j.dump().substr(0, 200);
  EXPECT_EQ(t.status().code(), code) << t.status().to_string();
  for (const auto& n : needles) {
    EXPECT_NE(t.status().message().find(n), std::string::npos)
        << "'" << n << "' not in: " << t.status().message();
  }
}

TEST(TokenizerErrors, BaseLoads) {
  auto t = Tokenizer::from_json(base_tokenizer().dump());
  ASSERT_TRUE(t.has_value()) << t.status().to_string();
}

TEST(TokenizerErrors, UnsupportedComponentsAreNamed) {
  auto j = base_tokenizer();
  j["model"]["type"] = "WordPiece";
  expect_error(j, ErrorCode::kUnsupported, {"bad/tokenizer.json", "WordPiece", "BPE"});
  j = base_tokenizer();
  j["model"]["type"] = "Unigram";
  expect_error(j, ErrorCode::kUnsupported, {"Unigram"});
  j = base_tokenizer();
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}};
  expect_error(j, ErrorCode::kUnsupported, {"normalizer.normalizers[1]", "Lowercase"});
  j = base_tokenizer();
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}};
  expect_error(j, ErrorCode::kUnsupported, {"pre_tokenizer", "Metaspace"});
  j = base_tokenizer();
  j["decoder"] = {{"type", "WordPiece"}};
  expect_error(j, ErrorCode::kUnsupported, {"decoder", "WordPiece"});
  j = base_tokenizer();
  j["post_processor"] = {{"type", "Whatever"}};
  expect_error(j, ErrorCode::kUnsupported, {"post_processor", "Whatever"});
  j = base_tokenizer();
  j["model"]["dropout"] = 0.1;
  expect_error(j, ErrorCode::kUnsupported, {"dropout"});
  j = base_tokenizer();
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "\\bx\\b"}}}, {"behavior", "Isolated"}, {"invert", false}};
  expect_error(j, ErrorCode::kUnsupported, {"pre_tokenizer", "word boundary"});
}

TEST(TokenizerErrors, CorruptFieldsAreNamed) {
  auto j = base_tokenizer();
  j.erase("model");
  expect_error(j, ErrorCode::kCorrupt, {"model"});
  j = base_tokenizer();
  j["model"]["merges"].push_back("Ġ nosuchtoken");
  expect_error(j, ErrorCode::kCorrupt, {"merges[", "nosuchtoken"});
  j = base_tokenizer();
  j["model"]["merges"].push_back(nlohmann::json::array({"a", "b", "c"}));
  expect_error(j, ErrorCode::kCorrupt, {"merges["});
  j = base_tokenizer();
  j["model"]["merges"].push_back("nospace");
  expect_error(j, ErrorCode::kCorrupt, {"nospace"});
  j = base_tokenizer();
  j["model"]["vocab"]["x"] = "seven";
  expect_error(j, ErrorCode::kCorrupt, {"vocab['x']"});
  j = base_tokenizer();
  j["added_tokens"][0].erase("content");
  expect_error(j, ErrorCode::kCorrupt, {"added_tokens[0]", "content"});
  j = base_tokenizer();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "\\s"}}}, {"behavior", "Sideways"}};
  expect_error(j, ErrorCode::kCorrupt, {"Sideways"});
  j = base_tokenizer();
  j["model"]["unk_token"] = "<nope>";
  expect_error(j, ErrorCode::kCorrupt, {"unk_token", "<nope>"});
  j = nlohmann::json::array();
  expect_error(j, ErrorCode::kCorrupt, {"expected a JSON object"});
}

TEST(TokenizerErrors, MissingAndMalformedFiles) {
  const std::string dir = ::testing::TempDir() + "/pd_tokenizer_errors";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto missing = Tokenizer::load(dir);
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(missing.status().message().find("tokenizer.json"), std::string::npos);

  std::ofstream(dir + "/tokenizer.json") << "{\"model\": {\"type\": \"BPE\", \"vocab\": {";  // truncated
  auto truncated = Tokenizer::load(dir);
  ASSERT_FALSE(truncated.has_value());
  EXPECT_EQ(truncated.status().code(), ErrorCode::kCorrupt);
  EXPECT_NE(truncated.status().message().find(dir + "/tokenizer.json"), std::string::npos);

  std::ofstream(dir + "/tokenizer.json") << base_tokenizer().dump();
  std::ofstream(dir + "/tokenizer_config.json")
      << R"({"eos_token": {"content": "</s>", "__type": "AddedToken"},
      "bos_token": "<s>", "pad_token": null, "chat_template": [{"name": "default", "template": "A"},
      {"name": "tool_use", "template": "B"}]})";
  auto ok = Tokenizer::load(dir);
  ASSERT_TRUE(ok.has_value()) << ok.status().to_string();
  EXPECT_EQ(ok->eos_token(), "</s>");
  EXPECT_EQ(ok->eos_token_id(), ok->token_to_id("</s>"));
  EXPECT_EQ(ok->bos_token_id(), ok->token_to_id("<s>"));
  EXPECT_FALSE(ok->pad_token_id().has_value());
  ASSERT_NE(ok->chat_template(), nullptr);
  EXPECT_EQ(*ok->chat_template(), "A");
  ASSERT_NE(ok->chat_template("tool_use"), nullptr);
  EXPECT_EQ(*ok->chat_template("tool_use"), "B");

  // A chat_template.jinja file (newer checkpoints) takes precedence over tokenizer_config.json.
  std::ofstream(dir + "/chat_template.jinja") << "{{ messages }}";
  auto with_file = Tokenizer::load(dir);
  ASSERT_TRUE(with_file.has_value());
  EXPECT_EQ(*with_file->chat_template(), "{{ messages }}");
  EXPECT_EQ(*with_file->chat_template("tool_use"), "B");

  std::ofstream(dir + "/tokenizer_config.json") << R"({"eos_token": "<|not_there|>"})";
  auto bad_eos = Tokenizer::load(dir);
  ASSERT_FALSE(bad_eos.has_value());
  EXPECT_NE(bad_eos.status().message().find("<|not_there|>"), std::string::npos);
  std::ofstream(dir + "/tokenizer_config.json") << R"({"eos_token": 5})";
  auto bad_type = Tokenizer::load(dir);
  ASSERT_FALSE(bad_type.has_value());
  EXPECT_NE(bad_type.status().message().find("eos_token"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(TokenizerErrors, InvalidUtf8IsRejectedNotGuessed) {
  auto t = Tokenizer::from_json(base_tokenizer().dump());
  ASSERT_TRUE(t.has_value());
  auto ids = t->encode("abc\x80", true);
  ASSERT_FALSE(ids.has_value());
  EXPECT_EQ(ids.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(ids.status().message().find("offset 3"), std::string::npos) << ids.status().message();
  // Unknown ids decode to nothing, as in HF.
  EXPECT_EQ(t->decode(std::vector<int32_t>{-1, 1 << 30}, false), "");
}

}  // namespace
}  // namespace pd
