// Shared by the golden and exactness tests: discovering and loading the fixtures of tests/fixtures/ (format
// in tests/fixtures/FORMAT.md) as models on the CPU backend, reading reference tensors, comparing.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "puredrive/backend/backend.h"
#include "puredrive/checkpoint/safetensors.h"
#include "puredrive/model/loader.h"
#include "puredrive/model/model.h"
#include "puredrive/util/mapped_file.h"

namespace pd::golden {

inline std::string fixtures_dir() {
  return std::string(PD_SOURCE_DIR) + "/tests/fixtures";
}

// Fixture directories that hold a reference.json, sorted.
inline std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(fixtures_dir(), ec)) {
    if (e.is_directory() && std::filesystem::exists(e.path() / "reference.json")) {
      names.push_back(e.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  if (names.empty()) names.push_back("none-found");  // makes the absence a visible failure
  return names;
}

struct Fixture {
  std::string name;
  std::string dir;
  double tolerance = 0;
  std::vector<std::string> prompts;
  Checkpoint ckpt;
  TensorStore reference;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;

  static Expected<std::unique_ptr<Fixture>> open(const std::string& name, int threads = 2,
                                                 int max_rows = 128) {
    auto fx = std::make_unique<Fixture>();
    fx->name = name;
    fx->dir = fixtures_dir() + "/" + name;
    PD_ASSIGN_OR_RETURN(std::string text, read_text_file(fx->dir + "/reference.json"));
    const nlohmann::json j = nlohmann::json::parse(text);
    fx->tolerance = j.at("tolerance").get<double>();
    fx->prompts = j.at("prompts").get<std::vector<std::string>>();
    PD_ASSIGN_OR_RETURN(fx->ckpt, load_checkpoint(fx->dir));
    PD_ASSIGN_OR_RETURN(fx->reference, TensorStore::open_files({fx->dir + "/reference.safetensors"}));
    PD_ASSIGN_OR_RETURN(fx->backend,
                        create_backend({.name = "cpu", .threads = threads, .min_parallel_work = 0}));
    PD_ASSIGN_OR_RETURN(
        fx->model, create_model(fx->ckpt.config, fx->ckpt.weights, *fx->backend, {.max_rows = max_rows}));
    return fx;
  }

  const ModelConfig& config() const { return ckpt.config; }

  SequenceState new_state(int ctx = 256, DType kv = DType::kF32, int max_rows = 8) const {
    Expected<SequenceState> s = model->new_state({.ctx_size = ctx, .kv_dtype = kv, .max_rows = max_rows});
    PD_ASSERT(s.has_value(), "{}", s.status().to_string());
    return std::move(s).value();
  }

  std::vector<float> download(const Tensor& t) const {
    std::vector<float> v(static_cast<size_t>(t.rows * t.cols));
    PD_ASSERT(backend->download(v.data(), t).is_ok());
    return v;
  }

  const TensorInfo& ref(const std::string& key) const {
    const TensorInfo* t = reference.find(key);
    PD_ASSERT(t != nullptr, "{}: reference.safetensors has no tensor {}", name, key);
    return *t;
  }
  std::vector<float> ref_floats(const std::string& key) const {
    const TensorInfo& t = ref(key);
    PD_ASSERT(t.dtype == DType::kF32, "{}: {} is not F32", name, key);
    std::vector<float> v(static_cast<size_t>(t.numel()));
    std::memcpy(v.data(), t.data, v.size() * sizeof(float));
    return v;
  }
  std::vector<int32_t> ref_ints(const std::string& key) const {
    const TensorInfo& t = ref(key);
    PD_ASSERT(t.dtype == DType::kI32, "{}: {} is not I32", name, key);
    std::vector<int32_t> v(static_cast<size_t>(t.numel()));
    std::memcpy(v.data(), t.data, v.size() * sizeof(int32_t));
    return v;
  }
};

// max |a - ref| / max |ref| (FORMAT.md); infinity on a size mismatch.
inline double rel_err(const std::vector<float>& a, const std::vector<float>& ref) {
  if (a.size() != ref.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(a[i]) - ref[i]));
    den = std::max(den, std::abs(static_cast<double>(ref[i])));
  }
  return den == 0 ? num : num / den;
}

// Rows `rows` of a row-major [total_rows, cols] array.
inline std::vector<float> select_rows(const std::vector<float>& all, int total_rows,
                                      const std::vector<int32_t>& rows) {
  const size_t cols = all.size() / static_cast<size_t>(total_rows);
  std::vector<float> out;
  out.reserve(rows.size() * cols);
  for (int32_t r : rows) {
    PD_ASSERT(r >= 0 && r < total_rows, "row {} outside [0, {})", r, total_rows);
    out.insert(out.end(), all.begin() + static_cast<int64_t>(r * cols),
               all.begin() + static_cast<int64_t>((r + 1) * cols));
  }
  return out;
}

// Lowest index of the maximum.
inline int32_t argmax(const float* x, int n) {
  int32_t best = 0;
  for (int i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

}  // namespace pd::golden
