// Small tokenizer.json files exercising what Qwen's tokenizer does not use (Split behaviours,
// normalizers, added-token flags, BPE options, post-processors, both merge formats), against Python
// tokenizers' outputs recorded by tools/reference/tokenizer/make_reference.py.
#include <gtest/gtest.h>

#include <filesystem>

#include "puredrive/tokenizer/detokenizer.h"
#include "puredrive/tokenizer/test_data.h"
#include "puredrive/tokenizer/tokenizer.h"
#include "puredrive/tokenizer/utf8.h"

namespace pd {
namespace {

std::vector<std::filesystem::path> feature_files() {
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(tok::testing::reference_dir() + "/features")) {
    if (e.path().extension() == ".json") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(Features, EncodeDecodeMatchPythonTokenizers) {
  const auto files = feature_files();
  ASSERT_GE(files.size(), 20u);
  for (const auto& path : files) {
    SCOPED_TRACE(path.filename().string());
    const auto doc = tok::testing::read_json(path.string());
    auto t = Tokenizer::from_json(doc["tokenizer"].dump(), "", path.filename().string());
    ASSERT_TRUE(t.has_value()) << t.status().to_string();
    EXPECT_EQ(t->vocab_size(), doc["vocab_size"].get<size_t>());
    for (const auto& c : doc["cases"]) {
      const std::string text = c["text"].get<std::string>();
      SCOPED_TRACE("text: " + text);
      auto ids = t->encode(text, true);
      ASSERT_TRUE(ids.has_value()) << ids.status().to_string();
      EXPECT_EQ(*ids, tok::testing::ids_of(c["ids"]));
      auto plain = t->encode(text, false);
      ASSERT_TRUE(plain.has_value());
      EXPECT_EQ(*plain, tok::testing::ids_of(c["ids_no_special"]));
      const auto ref_ids = tok::testing::ids_of(c["ids"]);
      EXPECT_EQ(t->decode(ref_ids, false), c["decoded"].get<std::string>());
      EXPECT_EQ(t->decode(ref_ids, true), c["decoded_skip"].get<std::string>());
      StreamingDetokenizer detok(*t);
      std::string streamed;
      for (const int32_t id : ref_ids) streamed += detok.push(id);
      streamed += detok.finish();
      EXPECT_EQ(streamed, c["decoded"].get<std::string>());
    }
  }
}

}  // namespace
}  // namespace pd
