// Test helpers: paths of the committed reference data (tests/tokenizer/, written by
// tools/reference/tokenizer/make_reference.py) and of the shared Qwen3 tokenizer.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "puredrive/tokenizer/tokenizer.h"

namespace pd::tok::testing {

inline std::string reference_dir() {
  return std::string(PD_SOURCE_DIR) + "/tests/tokenizer";
}
inline std::string qwen3_dir() {
  return std::string(PD_SOURCE_DIR) + "/../shared/data/tokenizers/qwen3";
}

inline std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return nlohmann::json::parse(in);
}

inline std::vector<int32_t> ids_of(const nlohmann::json& j) {
  return j.get<std::vector<int32_t>>();
}

// The Qwen3 tokenizer, loaded once per test binary; nullptr (with a loud message) when the shared data
// is not there.
inline const Tokenizer* qwen3_tokenizer() {
  static const Tokenizer* tok = []() -> const Tokenizer* {
    if (!std::filesystem::exists(qwen3_dir() + "/tokenizer.json")) return nullptr;
    auto t = Tokenizer::load(qwen3_dir());
    EXPECT_TRUE(t.has_value()) << t.status().to_string();
    if (!t) return nullptr;
    return new Tokenizer(std::move(t).value());
  }();
  return tok;
}

#define PD_REQUIRE_QWEN3(var)                                                                    \
  const ::pd::Tokenizer* var = ::pd::tok::testing::qwen3_tokenizer();                            \
  if (var == nullptr) {                                                                          \
    GTEST_SKIP() << "*** SKIPPED: shared test data missing: " << ::pd::tok::testing::qwen3_dir() \
                 << "/tokenizer.json ***";                                                       \
  }

}  // namespace pd::tok::testing
