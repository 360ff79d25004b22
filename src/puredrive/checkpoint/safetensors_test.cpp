#include "puredrive/checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>

#include "puredrive/checkpoint/safetensors_writer.h"
#include "puredrive/checkpoint/temp_dir_test_util.h"

namespace pd {
namespace {

using testing_util::TempDir;
using testing_util::write_text;

// An image with the given header text (length prefix added) followed by `data`.
std::string image(const std::string& header, const std::string& data = std::string(64, '\0')) {
  std::string out;
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out + header + data;
}

Expected<SafetensorsFile> parse(const std::string& img) {
  return SafetensorsFile::parse(reinterpret_cast<const uint8_t*>(img.data()), img.size(), "x.safetensors",
                                nullptr);
}

// Asserts that parsing fails and the message contains every fragment.
void expect_error(const Expected<SafetensorsFile>& r, std::initializer_list<const char*> fragments) {
  ASSERT_FALSE(r.has_value());
  for (const char* f : fragments) {
    EXPECT_NE(r.status().message().find(f), std::string::npos)
        << "message: " << r.status().message() << "\nmissing: " << f;
  }
}

TEST(Safetensors, ReadsFileWrittenByPythonSafetensors) {
  // safetensors 0.x `save({...}, metadata={"format": "pt"})` output, copied verbatim (independent writer).
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"codes":{"dtype":"I32","shape":[2],"data_offsets":[0,8]},)"
      R"("w":{"dtype":"BF16","shape":[2,3],"data_offsets":[8,20]},"f":{"dtype":"F16","shape":[2],)"
      R"("data_offsets":[20,24]},"b":{"dtype":"U8","shape":[3],"data_offsets":[24,27]}} )";
  const uint8_t data[] = {0x07, 0x00, 0x00, 0x00, 0xef, 0xbe, 0xad, 0x5e, 0xc0, 0x3f, 0x00, 0xc0, 0x50, 0x40,
                          0x00, 0x3f, 0x00, 0x00, 0x80, 0xbf, 0x00, 0x3c, 0x00, 0x40, 0x01, 0x02, 0x03};
  ASSERT_EQ(header.size(), 256u);
  const std::string img = image(header, std::string(reinterpret_cast<const char*>(data), sizeof(data)));
  auto f = parse(img);  // views into img
  ASSERT_TRUE(f.has_value()) << f.status().message();
  ASSERT_EQ(f->tensors().size(), 4u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  const auto& t = f->tensors();
  EXPECT_EQ(t[0].name, "codes");  // data-offset order
  EXPECT_EQ(t[1].name, "w");
  EXPECT_EQ(t[1].dtype, DType::kBF16);
  EXPECT_EQ(t[1].shape, (std::vector<int64_t>{2, 3}));
  uint16_t w[6];
  std::memcpy(w, t[1].data, 12);
  const float want[] = {1.5f, -2.0f, 3.25f, 0.5f, 0.0f, -1.0f};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(bf16_to_f32(w[i]), want[i]);
  int32_t codes[2];
  std::memcpy(codes, t[0].data, 8);
  EXPECT_EQ(codes[1], 0x5eadbeef);
  EXPECT_EQ(f16_to_f32(static_cast<uint16_t>(t[2].data[2] | (t[2].data[3] << 8))), 2.0f);
  EXPECT_EQ(t[3].dtype, DType::kU8);
  EXPECT_EQ(t[3].data[2], 3);
}

TEST(Safetensors, WriterRoundTripIsAlignedAndExact) {
  TempDir dir;
  SafetensorsWriter w;
  ASSERT_TRUE(w.add("odd", DType::kU8, {3}, std::vector<uint8_t>{1, 2, 3}).is_ok());
  ASSERT_TRUE(w.add_f32("half", DType::kBF16, {3}, {1.0f, -2.5f, 0.125f}).is_ok());
  ASSERT_TRUE(w.add_f32("full", DType::kF32, {2, 2}, {1.0f, 2.0f, 3.0f, 4.0f}).is_ok());
  ASSERT_TRUE(w.add("big", DType::kI64, {1}, std::vector<uint8_t>(8, 0xab)).is_ok());
  w.set_metadata("format", "pt");
  EXPECT_FALSE(w.add("full", DType::kF32, {1}, std::vector<uint8_t>(4)).is_ok());  // duplicate
  EXPECT_FALSE(w.add("bad", DType::kF32, {2}, std::vector<uint8_t>(4)).is_ok());   // size mismatch
  ASSERT_TRUE(w.write(dir.file("a.safetensors")).is_ok());
  auto f = SafetensorsFile::open(dir.file("a.safetensors"));
  ASSERT_TRUE(f.has_value()) << f.status().message();
  ASSERT_EQ(f->tensors().size(), 4u);
  for (const auto& t : f->tensors()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype), 0u) << t.name;
  }
  EXPECT_EQ(f->metadata().at("format"), "pt");
  TensorStore store = std::move(TensorStore::open_files({dir.file("a.safetensors")})).value();
  const TensorInfo* full = store.find("full");
  ASSERT_NE(full, nullptr);
  float v[4];
  std::memcpy(v, full->data, 16);
  EXPECT_EQ(v[3], 4.0f);
  EXPECT_EQ(store.find("odd")->data[2], 3);
  EXPECT_EQ(
      bf16_to_f32(static_cast<uint16_t>(store.find("half")->data[2] | (store.find("half")->data[3] << 8))),
      -2.5f);
  EXPECT_EQ(store.find("missing"), nullptr);
}

TEST(SafetensorsCorrupt, TooShort) {
  expect_error(parse("abcde"), {"x.safetensors", "5 bytes", "shorter than the 8-byte"});
}

TEST(SafetensorsCorrupt, HeaderLongerThanFile) {
  std::string img = image("{}", "");
  img[0] = 100;  // claims 100 bytes of header, has 2
  expect_error(parse(img), {"header length 100 exceeds the file size 10"});
}

TEST(SafetensorsCorrupt, AbsurdHeaderLength) {
  std::string img = image("{}", "");
  img[5] = 1;  // 2^40 + 2
  expect_error(parse(img), {"exceeds the 100 MB limit"});
}

TEST(SafetensorsCorrupt, HeaderNotJson) {
  expect_error(parse(image(R"({"a": {"dtype": "F32",)")), {"x.safetensors", "header is not valid JSON"});
}

TEST(SafetensorsCorrupt, HeaderNotUtf8) {
  expect_error(parse(image("{\"a\xff\": 1}")), {"not valid UTF-8", "byte 3"});
  expect_error(parse(image("{\"\xc0\xaf\": 1}")), {"not valid UTF-8"});      // overlong '/'
  expect_error(parse(image("{\"\xed\xa0\x80\": 1}")), {"not valid UTF-8"});  // surrogate
}

TEST(SafetensorsCorrupt, HeaderNotObject) {
  expect_error(parse(image("[1, 2]")), {"header is a JSON array, expected an object"});
  expect_error(parse(image(R"({"a": 3})")), {"tensor 'a'", "header entry is number"});
  expect_error(parse(image(R"({"__metadata__": [1]})")), {"__metadata__ is array"});
  expect_error(parse(image(R"({"a": {"dtype": "F32", "shape": [1]}})")), {"tensor 'a'", "data_offsets"});
  expect_error(parse(image(R"({"a": {"shape": [1], "data_offsets": [0, 4]}})")), {"tensor 'a'", "'dtype'"});
}

TEST(SafetensorsCorrupt, UnknownDtype) {
  expect_error(parse(image(R"({"w": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})")),
               {"tensor 'w'", "unknown dtype 'F64'", "BF16"});
}

TEST(SafetensorsCorrupt, ShapeDoesNotMatchSpan) {
  expect_error(parse(image(R"({"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 24]}})")),
               {"tensor 'w'", "byte span 24", "[2, 3] x BF16 (12 bytes)"});
  expect_error(parse(image(R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})")),
               {"tensor 'w'", "non-negative"});
  expect_error(
      parse(image(R"({"w": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 4]}})")),
      {"tensor 'w'", "overflows"});
}

TEST(SafetensorsCorrupt, OffsetsReversed) {
  expect_error(parse(image(R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})")),
               {"tensor 'w'", "[8, 4] begin after end"});
}

TEST(SafetensorsCorrupt, SpanOutsideDataRegion) {
  expect_error(parse(image(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [60, 76]}})")),
               {"tensor 'w'", "outside the data region (64 bytes)"});
}

TEST(SafetensorsCorrupt, OverlappingSpans) {
  expect_error(parse(image(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},)"
                           R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})")),
               {"'a' [0, 16)", "'b' [8, 16)", "overlap"});
  // Empty tensors sit anywhere without overlapping.
  EXPECT_TRUE(parse(image(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},)"
                          R"( "b": {"dtype": "F32", "shape": [0], "data_offsets": [8, 8]}})"))
                  .has_value());
}

TEST(SafetensorsCorrupt, DuplicateNames) {
  expect_error(parse(image(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                           R"( "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})")),
               {"tensor 'a' appears twice"});
}

TEST(SafetensorsCorrupt, TruncatedFileOnDisk) {
  TempDir dir;
  SafetensorsWriter w;
  ASSERT_TRUE(w.add_f32("w", DType::kF32, {16}, std::vector<float>(16, 1.0f)).is_ok());
  std::string img = w.serialize();
  write_text(dir.file("t.safetensors"), img.substr(0, img.size() - 10));
  auto f = SafetensorsFile::open(dir.file("t.safetensors"));
  ASSERT_FALSE(f.has_value());
  EXPECT_NE(f.status().message().find(dir.file("t.safetensors")), std::string::npos);
  EXPECT_NE(f.status().message().find("tensor 'w'"), std::string::npos);
  EXPECT_NE(f.status().message().find("truncated"), std::string::npos);
}

// A two-shard directory: a.safetensors {x, y}, b.safetensors {z}.
void write_shards(const TempDir& dir) {
  SafetensorsWriter a, b;
  ASSERT_TRUE(a.add_f32("x", DType::kF32, {2}, {1, 2}).is_ok());
  ASSERT_TRUE(a.add_f32("y", DType::kF32, {1}, {3}).is_ok());
  ASSERT_TRUE(b.add_f32("z", DType::kF32, {1}, {4}).is_ok());
  ASSERT_TRUE(a.write(dir.file("a.safetensors")).is_ok());
  ASSERT_TRUE(b.write(dir.file("b.safetensors")).is_ok());
}

TEST(SafetensorsShards, IndexMapsEveryTensor) {
  TempDir dir;
  write_shards(dir);
  write_text(
      dir.file("model.safetensors.index.json"),
      R"({"metadata": {}, "weight_map": {"x": "a.safetensors", "y": "a.safetensors", "z": "b.safetensors"}})");
  auto s = TensorStore::open_dir(dir.path());
  ASSERT_TRUE(s.has_value()) << s.status().message();
  EXPECT_EQ(s->tensors().size(), 3u);
  EXPECT_EQ(s->files().size(), 2u);
  EXPECT_EQ(s->find("z")->file, dir.file("b.safetensors"));
  EXPECT_EQ(s->total_bytes(), 16u);
}

TEST(SafetensorsShards, IndexNamesMissingShard) {
  TempDir dir;
  write_shards(dir);
  write_text(dir.file("model.safetensors.index.json"),
             R"({"weight_map": {"x": "a.safetensors", "z": "c.safetensors"}})");
  auto s = TensorStore::open_dir(dir.path());
  ASSERT_FALSE(s.has_value());
  EXPECT_EQ(s.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(s.status().message().find("names shard 'c.safetensors', which does not exist"), std::string::npos)
      << s.status().message();
}

TEST(SafetensorsShards, IndexNamesTensorNotInShard) {
  TempDir dir;
  write_shards(dir);
  write_text(dir.file("model.safetensors.index.json"),
             R"({"weight_map": {"x": "a.safetensors", "q": "b.safetensors", "z": "b.safetensors"}})");
  auto s = TensorStore::open_dir(dir.path());
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.status().message().find("tensor 'q' is mapped to b.safetensors, which does not contain it"),
            std::string::npos)
      << s.status().message();
  write_text(dir.file("model.safetensors.index.json"),
             R"({"weight_map": {"x": "b.safetensors", "y": "a.safetensors", "z": "b.safetensors"}})");
  s = TensorStore::open_dir(dir.path());
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.status().message().find("tensor 'x' is mapped to b.safetensors but found in"),
            std::string::npos)
      << s.status().message();
}

TEST(SafetensorsShards, BadIndexJson) {
  TempDir dir;
  write_shards(dir);
  write_text(dir.file("model.safetensors.index.json"), R"({"weight_map": )");
  auto s = TensorStore::open_dir(dir.path());
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.status().message().find("model.safetensors.index.json: not a JSON object"), std::string::npos);
  write_text(dir.file("model.safetensors.index.json"), R"({"metadata": {}})");
  s = TensorStore::open_dir(dir.path());
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.status().message().find("missing 'weight_map' object"), std::string::npos);
  write_text(dir.file("model.safetensors.index.json"), R"({"weight_map": {"x": "../a.safetensors"}})");
  s = TensorStore::open_dir(dir.path());
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.status().message().find("is not a file name"), std::string::npos);
}

TEST(SafetensorsShards, DuplicateAcrossShards) {
  TempDir dir;
  SafetensorsWriter a, b;
  ASSERT_TRUE(a.add_f32("x", DType::kF32, {1}, {1}).is_ok());
  ASSERT_TRUE(b.add_f32("x", DType::kF32, {1}, {2}).is_ok());
  ASSERT_TRUE(a.write(dir.file("a.safetensors")).is_ok());
  ASSERT_TRUE(b.write(dir.file("b.safetensors")).is_ok());
  auto s = TensorStore::open_files({dir.file("a.safetensors"), dir.file("b.safetensors")});
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.status().message().find("tensor 'x' appears in both"), std::string::npos)
      << s.status().message();
}

TEST(SafetensorsShards, DirectoryDiscovery) {
  TempDir dir;
  auto none = find_weight_files(dir.path());
  ASSERT_FALSE(none.has_value());
  EXPECT_EQ(none.status().code(), ErrorCode::kNotFound);
  write_shards(dir);  // two files, no index: ambiguous
  auto two = find_weight_files(dir.path());
  ASSERT_FALSE(two.has_value());
  EXPECT_NE(two.status().message().find("no model.safetensors.index.json"), std::string::npos);
  SafetensorsWriter m;
  ASSERT_TRUE(m.add_f32("x", DType::kF32, {1}, {1}).is_ok());
  ASSERT_TRUE(m.write(dir.file("model.safetensors")).is_ok());
  auto one = find_weight_files(dir.path());
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(*one, std::vector<std::string>{dir.file("model.safetensors")});
}

}  // namespace
}  // namespace pd
