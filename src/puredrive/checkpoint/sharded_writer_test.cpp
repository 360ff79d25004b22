#include "puredrive/checkpoint/sharded_writer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "puredrive/checkpoint/safetensors.h"
#include "puredrive/checkpoint/temp_dir_test_util.h"
#include "puredrive/util/mapped_file.h"

namespace pd {
namespace {

using testing_util::TempDir;
using testing_util::write_text;

std::vector<uint8_t> bytes_of(const PlannedTensor& t, uint8_t seed) {
  std::vector<uint8_t> v(t.nbytes);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(seed + 7 * i);
  return v;
}

TEST(ShardedWriter, WritesShardsThatTheReaderOpens) {
  TempDir dir;
  write_text(dir.file("model-00001-of-00009.safetensors"), "stale");  // from an earlier run: removed
  std::vector<PlannedTensor> t = {
      planned_tensor("a.weight", DType::kU32, {4, 8}), planned_tensor("a.scales", DType::kBF16, {4, 2}),
      planned_tensor("a.biases", DType::kBF16, {4, 2}), planned_tensor("b", DType::kF32, {100}),
      planned_tensor("c", DType::kBF16, {3, 5})};
  // Groups of 160 + 400 + 30 bytes; 450 per shard keeps a and c apart from b.
  ShardingOptions o;
  o.max_shard_bytes = 450;
  o.pattern = "model.safetensors-{:05d}-of-{:05d}.safetensors";
  o.metadata = {{"format", "pt"}};
  auto w = ShardedWriter::create(dir.path(), t, {{0, 1, 2}, {3}, {4}}, o);
  ASSERT_TRUE(w.has_value()) << w.status().message();
  ASSERT_EQ((*w)->files().size(), 2u);
  EXPECT_EQ((*w)->files()[0], "model.safetensors-00001-of-00002.safetensors");
  // Every tensor written in two halves from two threads, the second half first.
  std::vector<std::thread> threads;
  for (size_t i = 0; i < t.size(); ++i) {
    threads.emplace_back([&, i] {
      const std::vector<uint8_t> b = bytes_of(t[i], static_cast<uint8_t>(i));
      const size_t half = b.size() / 2;
      EXPECT_TRUE((*w)->write(i, half, b.data() + half, b.size() - half).is_ok());
      EXPECT_TRUE((*w)->write(i, 0, b.data(), half).is_ok());
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_FALSE((*w)->write(4, 20, "xxxxxxxxxxxx", 12).is_ok()) << "past the tensor's end";
  ASSERT_TRUE((*w)->finish().is_ok());

  EXPECT_FALSE(std::filesystem::exists(dir.file("model-00001-of-00009.safetensors")));
  auto store = TensorStore::open_dir(dir.path());
  ASSERT_TRUE(store.has_value()) << store.status().message();
  for (size_t i = 0; i < t.size(); ++i) {
    const TensorInfo* got = store->find(t[i].name);
    ASSERT_NE(got, nullptr) << t[i].name;
    EXPECT_EQ(got->dtype, t[i].dtype);
    EXPECT_EQ(got->shape, t[i].shape);
    const std::vector<uint8_t> want = bytes_of(t[i], static_cast<uint8_t>(i));
    ASSERT_EQ(got->nbytes, want.size());
    EXPECT_EQ(0, std::memcmp(got->data, want.data(), want.size())) << t[i].name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(got->data) % dtype_size(got->dtype), 0u) << "aligned";
  }
  EXPECT_EQ(store->find("a.weight")->file, store->find("a.biases")->file) << "a group shares a shard";
  EXPECT_NE(store->find("a.weight")->file, store->find("b")->file);
  auto index = read_text_file(dir.file("model.safetensors.index.json"));
  ASSERT_TRUE(index.has_value());
  const auto j = nlohmann::json::parse(*index);
  EXPECT_EQ(j["metadata"]["total_size"].get<uint64_t>(), 128u + 16 + 16 + 400 + 30);
  EXPECT_EQ(store->files()[0].metadata().at("format"), "pt");
}

TEST(ShardedWriter, OneFileWithoutIndexWhenAsked) {
  TempDir dir;
  ShardingOptions o;
  o.index_when_single = false;
  auto w = ShardedWriter::create(dir.path(), {planned_tensor("x", DType::kF32, {2})}, {{0}}, o);
  ASSERT_TRUE(w.has_value());
  const float v[2] = {1.5f, -2.0f};
  ASSERT_TRUE((*w)->write(0, 0, v, 8).is_ok());
  ASSERT_TRUE((*w)->finish().is_ok());
  EXPECT_EQ((*w)->files(), std::vector<std::string>{"model.safetensors"});
  EXPECT_FALSE(std::filesystem::exists(dir.file("model.safetensors.index.json")));
  auto store = TensorStore::open_dir(dir.path());
  ASSERT_TRUE(store.has_value());
  EXPECT_EQ(std::memcmp(store->find("x")->data, v, 8), 0);
}

TEST(ShardedWriter, RefusesABadGrouping) {
  TempDir dir;
  const std::vector<PlannedTensor> t = {planned_tensor("x", DType::kF32, {2}),
                                        planned_tensor("y", DType::kF32, {2})};
  EXPECT_FALSE(ShardedWriter::create(dir.path(), t, {{0}}, {}).has_value()) << "y in no group";
  EXPECT_FALSE(ShardedWriter::create(dir.path(), t, {{0, 1}, {1}}, {}).has_value()) << "y twice";
}

}  // namespace
}  // namespace pd
