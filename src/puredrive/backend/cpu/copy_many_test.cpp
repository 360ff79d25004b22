// copy_many on the CPU backend: regions of every size and alignment against a byte-by-byte reference, and bad
// lists refused before any byte moves.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "puredrive/backend/cpu/test_util.h"

namespace pd {
namespace {

// A backend buffer of random bytes and its copy on the host, which the reference updates.
struct Bytes {
  Buffer buf;
  std::vector<uint8_t> mirror;
};

Bytes random_bytes(Backend& be, std::mt19937& rng, DType dtype, int64_t rows, int64_t cols) {
  Bytes b;
  b.buf = be.alloc(dtype, rows, cols).value();
  b.mirror.resize(static_cast<size_t>(b.buf.nbytes()));
  for (uint8_t& v : b.mirror) v = static_cast<uint8_t>(rng());
  EXPECT_TRUE(be.upload(b.buf.tensor(), b.mirror.data()).is_ok());
  return b;
}

std::vector<uint8_t> contents(Backend& be, const Bytes& b) {
  std::vector<uint8_t> out(b.mirror.size());
  EXPECT_TRUE(be.download(out.data(), b.buf.tensor()).is_ok());
  return out;
}

TEST(CpuCopyMany, CopiesRegionsOfAnySizeAndAlignment) {
  std::mt19937 rng(5);
  auto be = test::cpu_backend(1);
  Bytes a = random_bytes(*be, rng, DType::kU8, 1, 4099);
  Bytes b = random_bytes(*be, rng, DType::kBF16, 37, 29);  // 2146 bytes, rows of 58
  Bytes c = random_bytes(*be, rng, DType::kF32, 1, 513);
  struct Case {
    Bytes* dst;
    int64_t dst_offset;
    Bytes* src;
    int64_t src_offset;
    int64_t bytes;
  };
  // Destinations apart from each other and from every source; sources may overlap (reads only).
  const std::vector<Case> cases = {
      {&b, 0, &a, 0, 1},        {&b, 1, &a, 3, 15},     {&b, 17, &a, 100, 16},   {&b, 33, &a, 101, 17},
      {&b, 58, &a, 7, 255},     {&b, 400, &a, 1, 1000}, {&b, 2145, &a, 4098, 1}, {&c, 3, &a, 2000, 2049},
      {&c, 2052, &a, 2001, 0},  {&b, 1500, &c, 0, 0},   {&a, 4000, &c, 2052, 0}, {&b, 1401, &a, 2500, 99},
      {&b, 1600, &a, 3000, 545}};
  std::vector<CopyRegion> regions;
  for (const Case& k : cases) {
    regions.push_back({.dst = k.dst->buf.tensor(),
                       .dst_offset = k.dst_offset,
                       .src = k.src->buf.tensor(),
                       .src_offset = k.src_offset,
                       .bytes = k.bytes});
  }
  const std::vector<uint8_t> a0 = a.mirror, c0 = c.mirror;  // sources as they were before the copies
  for (const Case& k : cases) {
    const std::vector<uint8_t>& from = k.src == &a ? a0 : c0;
    for (int64_t i = 0; i < k.bytes; ++i) {
      k.dst->mirror[static_cast<size_t>(k.dst_offset + i)] = from[static_cast<size_t>(k.src_offset + i)];
    }
  }
  ASSERT_TRUE(be->copy_many(regions).is_ok());
  EXPECT_EQ(contents(*be, a), a.mirror);
  EXPECT_EQ(contents(*be, b), b.mirror);
  EXPECT_EQ(contents(*be, c), c.mirror);
  EXPECT_TRUE(be->copy_many({}).is_ok());
}

TEST(CpuCopyMany, RefusesBadListsBeforeCopyingAnything) {
  std::mt19937 rng(6);
  auto be = test::cpu_backend(1);
  Bytes a = random_bytes(*be, rng, DType::kU8, 1, 256);
  Bytes b = random_bytes(*be, rng, DType::kF32, 4, 16);  // 256 bytes
  const Tensor ta = a.buf.tensor(), tb = b.buf.tensor();
  const CopyRegion good{.dst = tb, .dst_offset = 0, .src = ta, .src_offset = 0, .bytes = 64};
  struct Bad {
    CopyRegion region;
    std::string says;
  };
  const std::vector<Bad> bad = {
      {{.dst = tb, .dst_offset = 200, .src = ta, .src_offset = 0, .bytes = 57}, "writes bytes [200, 257)"},
      {{.dst = tb, .dst_offset = 100, .src = ta, .src_offset = 250, .bytes = 7}, "reads bytes [250, 257)"},
      {{.dst = tb, .dst_offset = -1, .src = ta, .src_offset = 0, .bytes = 1}, "writes bytes [-1, 0)"},
      {{.dst = tb, .dst_offset = 100, .src = ta, .src_offset = 0, .bytes = -2}, "-2 bytes"},
      {{.dst = tb, .dst_offset = 63, .src = ta, .src_offset = 100, .bytes = 2}, "regions 0 and 1 overlap"},
      {{.dst = ta, .dst_offset = 60, .src = ta, .src_offset = 100, .bytes = 8}, "regions 0 and 1 overlap"},
      {{.dst = ta, .dst_offset = 100, .src = ta, .src_offset = 104, .bytes = 8},
       "source and destination overlap"},
      {{.dst = tb.col_slice(0, 8), .dst_offset = 100, .src = ta, .src_offset = 100, .bytes = 8}, "not dense"},
      {{.dst = Tensor{}, .dst_offset = 0, .src = ta, .src_offset = 100, .bytes = 8}, "destination is empty"},
  };
  for (const Bad& k : bad) {
    const std::vector<CopyRegion> list = {good, k.region};
    const Status s = be->copy_many(list);
    ASSERT_FALSE(s.is_ok()) << k.says;
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(s.message().find(k.says), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("copy_many"), std::string::npos) << s.message();
    EXPECT_EQ(contents(*be, b), b.mirror) << "a refused list copies nothing: " << k.says;
  }
}

}  // namespace
}  // namespace pd
