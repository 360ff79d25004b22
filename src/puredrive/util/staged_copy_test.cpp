#include "puredrive/util/staged_copy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <vector>

#include "puredrive/util/mapped_file.h"

namespace pd {
namespace {

// A target that moves a buffer only when the copier waits for it (or finishes): if the copier refilled a
// buffer before waiting, the bytes of the earlier chunk would be lost, and the comparison below would fail
// whatever the thread timing.
class LazyTarget : public StagingTarget {
 public:
  LazyTarget(int workers, size_t chunk) : chunk_(chunk) {
    buffers_.resize(static_cast<size_t>(workers * StagedCopier::kSlots), std::vector<uint8_t>(chunk));
    pending_.resize(buffers_.size());
  }
  uint8_t* buffer(int w, int s) override { return buffers_[index(w, s)].data(); }
  Status wait(int w, int s) override {
    drain(index(w, s));
    return Status::ok();
  }
  Status submit(int w, int s, void* dst, size_t n) override {
    if (fail_after_ >= 0 && submitted_++ >= fail_after_) {
      return make_error(ErrorCode::kIo, "target refused chunk");
    }
    if (n > chunk_) return make_error(ErrorCode::kInternal, "chunk of {} bytes > {}", n, chunk_);
    pending_[index(w, s)] = Pending{static_cast<uint8_t*>(dst), n};
    return Status::ok();
  }
  Status finish() override {
    for (size_t i = 0; i < pending_.size(); ++i) drain(i);
    return Status::ok();
  }
  void fail_after(int n) { fail_after_ = n; }

 private:
  struct Pending {
    uint8_t* dst;
    size_t n;
  };
  size_t index(int w, int s) const { return static_cast<size_t>(w * StagedCopier::kSlots + s); }
  void drain(size_t i) {
    if (!pending_[i]) return;
    std::memcpy(pending_[i]->dst, buffers_[i].data(), pending_[i]->n);
    pending_[i].reset();
  }
  size_t chunk_;
  std::vector<std::vector<uint8_t>> buffers_;
  std::vector<std::optional<Pending>> pending_;
  int fail_after_ = -1;
  std::atomic<int> submitted_{0};
};

std::string temp_file(const std::vector<uint8_t>& bytes) {
  const char* base = std::getenv("TMPDIR");
  std::string path = std::string(base != nullptr ? base : "/tmp") + "/pd_staged_copy_XXXXXX";
  const int fd = ::mkstemp(path.data());
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  ::close(fd);
  return path;
}

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

TEST(StagedCopy, CopiesMappedAndHeapRangesExactly) {
  const std::vector<uint8_t> file_bytes = pattern(200000, 1);
  const std::string path = temp_file(file_bytes);
  auto mapped = MappedFile::open(path);
  ASSERT_TRUE(mapped.has_value()) << mapped.status().message();
  const std::vector<uint8_t> heap = pattern(50001, 2);
  for (const auto& [workers, read] : {std::pair{1, WeightRead::kPread}, std::pair{3, WeightRead::kPread},
                                      std::pair{3, WeightRead::kMapped}}) {
    StagedCopier copier(workers, 4096, read);
    LazyTarget target(copier.workers(), copier.chunk_bytes());
    std::vector<uint8_t> out(file_bytes.size() + heap.size() + 77, 0xEE);
    // Odd offsets and lengths: ranges end mid-chunk, one range is empty, one reads the file's last byte.
    std::vector<CopyRange> ranges = {
        {out.data(), (*mapped)->data() + 13, 100000},
        {out.data() + 100000, heap.data(), heap.size()},
        {out.data() + 150001, (*mapped)->data() + 100013, 0},
        {out.data() + 150001, (*mapped)->data() + 100013, file_bytes.size() - 100013},
    };
    ASSERT_TRUE(copier.copy(ranges, target).is_ok());
    EXPECT_EQ(0, std::memcmp(out.data(), file_bytes.data() + 13, 100000));
    EXPECT_EQ(0, std::memcmp(out.data() + 100000, heap.data(), heap.size()));
    EXPECT_EQ(0, std::memcmp(out.data() + 150001, file_bytes.data() + 100013, file_bytes.size() - 100013));
    EXPECT_EQ(out[150001 + file_bytes.size() - 100013], 0xEE) << "wrote past the last range";
    EXPECT_EQ(copier.bytes_copied(), 100000 + heap.size() + file_bytes.size() - 100013);
  }
  std::filesystem::remove(path);
}

TEST(StagedCopy, ReportsTheTargetsError) {
  const std::vector<uint8_t> src = pattern(40000, 3);
  std::vector<uint8_t> out(src.size());
  StagedCopier copier(2, 4096);
  LazyTarget target(copier.workers(), copier.chunk_bytes());
  target.fail_after(3);
  const CopyRange r{out.data(), src.data(), src.size()};
  const Status st = copier.copy(std::span(&r, 1), target);
  EXPECT_EQ(st.code(), ErrorCode::kIo);
  EXPECT_NE(st.message().find("refused"), std::string::npos);
}

TEST(MappedFile, ReadWeightBytesReadsTheFileBehindAMapping) {
  const std::vector<uint8_t> bytes = pattern(10000, 4);
  const std::string path = temp_file(bytes);
  {
    auto mapped = MappedFile::open(path);
    ASSERT_TRUE(mapped.has_value());
    for (WeightRead how : {WeightRead::kPread, WeightRead::kMapped}) {
      std::vector<uint8_t> out(7777);
      ASSERT_TRUE(read_weight_bytes(out.data(), (*mapped)->data() + 1000, out.size(), how).is_ok());
      EXPECT_EQ(0, std::memcmp(out.data(), bytes.data() + 1000, out.size()));
      // Pages dropped after a mapped read come back from the file.
      EXPECT_EQ(0, std::memcmp((*mapped)->data() + 4096, bytes.data() + 4096, 4096));
    }
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace pd
