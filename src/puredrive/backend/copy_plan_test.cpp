// The plan of copy_many on the GPU (cuda/copy_plan.h), checked on the host: rounds run here as the CUDA
// backend runs them (table and staged bytes in one buffer, then every piece, then the staged bytes out), with
// memcpy for the kernel, against each span copied directly.
#include "puredrive/backend/cuda/copy_plan.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

namespace pd::cuda {
namespace {

constexpr int64_t kArena = 16384;

// Four arenas: device and host sources and destinations.
struct Arenas {
  std::vector<uint8_t> dev_src = std::vector<uint8_t>(kArena), host_src = std::vector<uint8_t>(kArena);
  std::vector<uint8_t> dev_dst = std::vector<uint8_t>(kArena), host_dst = std::vector<uint8_t>(kArena);
};

// Random spans of every kind but host to host, with destinations apart from each other.
std::vector<CopySpan> random_spans(Arenas& a, std::mt19937& rng, int count, int64_t max_bytes) {
  for (auto* v : {&a.dev_src, &a.host_src, &a.dev_dst, &a.host_dst}) {
    for (uint8_t& b : *v) b = static_cast<uint8_t>(rng());
  }
  std::vector<CopySpan> spans;
  int64_t next[2] = {0, 0};  // first free byte of the device and host destinations
  for (int i = 0; i < count; ++i) {
    const int kind = static_cast<int>(rng() % 3);  // device to device, host to device, device to host
    const bool dst_host = kind == 2, src_host = kind == 1;
    const int64_t bytes = static_cast<int64_t>(rng() % static_cast<uint64_t>(max_bytes + 1));
    int64_t& at = next[dst_host ? 1 : 0];
    at += static_cast<int64_t>(rng() % 19);
    if (at + bytes > kArena) break;
    const int64_t from = static_cast<int64_t>(rng() % static_cast<uint64_t>(kArena - bytes + 1));
    spans.push_back({.dst = (dst_host ? a.host_dst : a.dev_dst).data() + at,
                     .src = (src_host ? a.host_src : a.dev_src).data() + from,
                     .bytes = bytes,
                     .dst_host = dst_host,
                     .src_host = src_host});
    at += bytes;
  }
  return spans;
}

// Runs the rounds as cuda/copy_runner.cpp does, with pinned memory that the "device" reads directly.
void run_rounds(const std::vector<CopyRound>& rounds) {
  for (const CopyRound& r : rounds) {
    const size_t size = static_cast<size_t>((r.pinned_bytes() + 255) / 256 * 256);
    std::unique_ptr<uint8_t, decltype(&std::free)> pinned(
        static_cast<uint8_t*>(std::aligned_alloc(256, size)), &std::free);
    r.write_table(pinned.get(), pinned.get());
    uint8_t* data = pinned.get() + r.data_offset();
    for (const StagedIn& in : r.in) std::memcpy(data + in.offset, in.host, static_cast<size_t>(in.bytes));
    const auto* table = reinterpret_cast<const CopyPiece*>(pinned.get());
    for (size_t i = 0; i < r.pieces.size(); ++i) {
      std::memcpy(table[i].dst, table[i].src, static_cast<size_t>(table[i].bytes));
    }
    for (const StagedOut& out : r.out)
      std::memcpy(out.host, data + out.offset, static_cast<size_t>(out.bytes));
  }
}

TEST(CopyPlan, RoundsCopyEverySpanWithinTheirBounds) {
  constexpr int64_t kRound = 1000, kPiece = 64;
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    Arenas a;
    const std::vector<CopySpan> spans = random_spans(a, rng, 120, seed % 4 == 0 ? 2600 : 300);
    Arenas want = a;
    for (const CopySpan& s : spans) {
      const auto shift = [&](const std::vector<uint8_t>& from, std::vector<uint8_t>& to, const uint8_t* p) {
        return to.data() + (p - from.data());
      };
      uint8_t* dst =
          s.dst_host ? shift(a.host_dst, want.host_dst, s.dst) : shift(a.dev_dst, want.dev_dst, s.dst);
      const uint8_t* src =
          s.src_host ? shift(a.host_src, want.host_src, s.src) : shift(a.dev_src, want.dev_src, s.src);
      std::memcpy(dst, src, static_cast<size_t>(s.bytes));
    }
    const std::vector<CopyRound> rounds = plan_copies(spans, kRound, kPiece);
    // Rounds are full but for alignment (< 31 bytes per staged range; a span cut between rounds is two).
    int64_t host_bytes = 0, host_spans = 0;
    for (const CopySpan& s : spans) {
      if (s.dst_host || s.src_host) {
        host_bytes += s.bytes;
        ++host_spans;
      }
    }
    const auto n = static_cast<int64_t>(rounds.size());
    ASSERT_LE(n * (kRound - 62), host_bytes + 31 * host_spans + kRound) << "seed " << seed;
    for (const CopyRound& r : rounds) {
      ASSERT_FALSE(r.pieces.empty());
      ASSERT_EQ(r.pieces.size(), r.staged.size());
      ASSERT_LE(r.data_bytes, kRound);
      ASSERT_EQ(r.data_offset() % 256, 0);
      for (size_t i = 0; i < r.pieces.size(); ++i) {
        const CopyPiece& p = r.pieces[i];
        ASSERT_GT(p.bytes, 0);
        ASSERT_LE(p.bytes, kPiece);
        // A staged side keeps the alignment of the device side it pairs with.
        if (r.staged[i] == CopyRound::kStagedSrc) {
          ASSERT_EQ(reinterpret_cast<uintptr_t>(p.src) % 16, reinterpret_cast<uintptr_t>(p.dst) % 16);
        } else if (r.staged[i] == CopyRound::kStagedDst) {
          ASSERT_EQ(reinterpret_cast<uintptr_t>(p.dst) % 16, reinterpret_cast<uintptr_t>(p.src) % 16);
        }
      }
    }
    run_rounds(rounds);
    ASSERT_EQ(a.dev_dst, want.dev_dst) << "seed " << seed;
    ASSERT_EQ(a.host_dst, want.host_dst) << "seed " << seed;
    ASSERT_EQ(a.dev_src, want.dev_src);
    ASSERT_EQ(a.host_src, want.host_src);
  }
}

TEST(CopyPlan, DeviceCopiesTakeOneRoundWhateverTheirNumber) {
  std::vector<uint8_t> src(1 << 20), dst(1 << 20);
  std::vector<CopySpan> spans;
  for (int64_t i = 0; i < 10000; ++i) spans.push_back({dst.data() + i * 100, src.data() + i * 100, 100});
  spans.push_back({dst.data(), src.data(), 0});
  const std::vector<CopyRound> rounds = plan_copies(spans);
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].pieces.size(), 10000u);
  EXPECT_TRUE(rounds[0].in.empty() && rounds[0].out.empty());
  EXPECT_TRUE(plan_copies({}).empty());
  // One long span is cut into pieces of kCopyPieceBytes.
  const std::vector<CopyRound> long_one = plan_copies({{dst.data(), src.data(), 1 << 20}});
  ASSERT_EQ(long_one.size(), 1u);
  EXPECT_EQ(long_one[0].pieces.size(), static_cast<size_t>((1 << 20) / kCopyPieceBytes));
}

}  // namespace
}  // namespace pd::cuda
