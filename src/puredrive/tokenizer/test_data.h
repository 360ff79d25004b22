// Test helpers: paths of the committed reference data (tests/tokenizer/, written by
// tools/reference/tokenizer/make_reference.py) and of the Qwen3 tokenizer (tests/data/qwen3, unpacked by the
// build into PD_TEST_DATA_DIR).
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
  return std::string(PD_TEST_DATA_DIR) + "/qwen3";
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

// The Qwen3 tokenizer, loaded once per test binary; nullptr (and a failed expectation) when it cannot be
// loaded.
inline const Tokenizer* qwen3_tokenizer() {
  static const Tokenizer* tok = []() -> const Tokenizer* {
    auto t = Tokenizer::load(qwen3_dir());
    EXPECT_TRUE(t.has_value()) << t.status().to_string();
    if (!t) return nullptr;
    return new Tokenizer(std::move(t).value());
  }();
  return tok;
}

// Missing test data is a failure, never a skip: the data is part of the repository.
#define PD_REQUIRE_QWEN3(var)                                                            \
  const ::pd::Tokenizer* var = ::pd::tok::testing::qwen3_tokenizer();                    \
  if (var == nullptr) {                                                                  \
    FAIL() << "cannot load the Qwen3 tokenizer from " << ::pd::tok::testing::qwen3_dir() \
           << " (unpacked from tests/data/qwen3 at configure time; rerun cmake)";        \
  }

}  // namespace pd::tok::testing
