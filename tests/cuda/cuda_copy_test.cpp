// copy_many on the CUDA backend (cuda/copy_plan.h, cuda/copy_runner.h) against bytes copied one by one on the
// host: thousands of device regions of every size and alignment in one call, host sources and destinations
// (the prefix cache's host tier) larger than a staging round, calls queued faster than the device runs them,
// ordering with the ops around them, and bad lists; copy, fill_zero and upload on views of every alignment.
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "puredrive/backend/cuda/cuda_backend.h"

namespace pd {
namespace {

Tensor host_bytes(std::vector<uint8_t>& v) {
  const auto n = static_cast<int64_t>(v.size());
  return {.data = v.data(), .dtype = DType::kU8, .rows = 1, .cols = n, .stride = n, .device = Device::kCpu};
}

std::vector<uint8_t> random_vector(std::mt19937& rng, int64_t n) {
  std::vector<uint8_t> v(static_cast<size_t>(n));
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// Device memory with random bytes, and its expected contents.
struct DeviceBytes {
  Buffer buf;
  std::vector<uint8_t> want;
};

DeviceBytes device_bytes(Backend& be, std::mt19937& rng, DType dtype, int64_t rows, int64_t cols) {
  DeviceBytes d;
  d.buf = be.alloc(dtype, rows, cols).value();
  d.want = random_vector(rng, d.buf.nbytes());
  EXPECT_TRUE(be.upload(d.buf.tensor(), d.want.data()).is_ok());
  return d;
}

// A list of regions and the bytes it should leave: each region is also copied byte by byte on the host into
// the expected contents of its destination (sources are never destinations, so order does not matter).
struct Plan {
  std::vector<CopyRegion> regions;
  void add(const Tensor& dst, std::vector<uint8_t>& dst_want, int64_t dst_offset, const Tensor& src,
           const std::vector<uint8_t>& src_bytes, int64_t src_offset, int64_t bytes) {
    regions.push_back(
        {.dst = dst, .dst_offset = dst_offset, .src = src, .src_offset = src_offset, .bytes = bytes});
    for (int64_t i = 0; i < bytes; ++i) {
      dst_want[static_cast<size_t>(dst_offset + i)] = src_bytes[static_cast<size_t>(src_offset + i)];
    }
  }
};

TEST(CudaCopyMany, EveryKindOfRegionInOneCall) {
  PD_CUDA_OR_SKIP(gpu);
  std::mt19937 rng(17);
  const int64_t big = cudatest::quick() ? int64_t{3} << 20 : int64_t{40} << 20;  // > a 16 MiB staging round
  const int64_t arena = 2 * big + (int64_t{8} << 20);
  DeviceBytes dsrc = device_bytes(*gpu, rng, DType::kBF16, arena / 1024, 512);  // 1 KiB rows
  DeviceBytes ddst = device_bytes(*gpu, rng, DType::kU8, 1, arena);
  std::vector<uint8_t> hsrc = random_vector(rng, arena), hdst = random_vector(rng, arena);
  std::vector<uint8_t> hdst_want = hdst, hsrc2 = random_vector(rng, 4096), hdst2 = random_vector(rng, 4096);
  std::vector<uint8_t> hdst2_want = hdst2;
  const Tensor ds = dsrc.buf.tensor(), dd = ddst.buf.tensor(), hs = host_bytes(hsrc), hd = host_bytes(hdst);
  Plan plan;
  // Destinations are laid out one after another, each list in its own part of ddst / hdst.
  int64_t at_dev = 0, at_host = 0;
  auto next = [&](int64_t& at, int64_t bytes) {
    at += static_cast<int64_t>(rng() % 40);
    const int64_t here = at;
    at += bytes;
    return here;
  };
  auto from = [&](int64_t bytes) {
    return static_cast<int64_t>(rng() % static_cast<uint64_t>(arena - bytes));
  };
  for (int i = 0; i < 6000; ++i) {  // device to device: sizes 0..300, any alignment
    const int64_t n = static_cast<int64_t>(rng() % 301);
    plan.add(dd, ddst.want, next(at_dev, n), ds, dsrc.want, from(n), n);
  }
  plan.add(dd, ddst.want, next(at_dev, 3 << 20), ds, dsrc.want, 4096, 3 << 20);  // many pieces, aligned
  for (int i = 0; i < 500; ++i) {  // host to device and device to host
    const int64_t n = static_cast<int64_t>(rng() % 3000);
    plan.add(dd, ddst.want, next(at_dev, n), hs, hsrc, from(n), n);
    const int64_t m = static_cast<int64_t>(rng() % 3000);
    plan.add(hd, hdst_want, next(at_host, m), ds, dsrc.want, from(m), m);
  }
  plan.add(dd, ddst.want, next(at_dev, big / 2), hs, hsrc, 7, big / 2);  // several rounds
  plan.add(hd, hdst_want, next(at_host, big / 2 + 5), ds, dsrc.want, 3, big / 2 + 5);
  plan.add(host_bytes(hdst2), hdst2_want, 1, host_bytes(hsrc2), hsrc2, 2, 4000);  // host to host
  ASSERT_LE(at_dev, arena);
  ASSERT_LE(at_host, arena);
  std::shuffle(plan.regions.begin(), plan.regions.end(), rng);
  const Status s = gpu->copy_many(plan.regions);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_TRUE(hdst == hdst_want) << "host destinations hold their bytes when the call returns";
  EXPECT_TRUE(hdst2 == hdst2_want);
  EXPECT_TRUE(cudatest::download_bytes(*gpu, dd) == ddst.want);
  EXPECT_TRUE(cudatest::download_bytes(*gpu, ds) == dsrc.want) << "sources unchanged";
}

TEST(CudaCopyMany, CallsQueuedBehindDeviceWorkKeepTheirBytes) {
  PD_CUDA_OR_SKIP(gpu);
  std::mt19937 rng(18);
  const int64_t busy = cudatest::quick() ? int64_t{8} << 20 : int64_t{512} << 20;
  DeviceBytes a = device_bytes(*gpu, rng, DType::kU8, 1, busy);
  DeviceBytes b = device_bytes(*gpu, rng, DType::kU8, 1, busy);
  DeviceBytes out = device_bytes(*gpu, rng, DType::kU8, 1, 64 * 4096);
  std::vector<uint8_t> host(4096);
  for (int round = 0; round < 3; ++round) {
    // A long copy keeps the device busy while the host queues the small ones, which reuse pinned buffers.
    Plan keep_busy;
    keep_busy.add(b.buf.tensor(), b.want, 0, a.buf.tensor(), a.want, 0, busy);
    ASSERT_TRUE(gpu->copy_many(keep_busy.regions).is_ok());
    for (int i = 0; i < 64; ++i) {
      std::fill(host.begin(), host.end(), static_cast<uint8_t>(round * 64 + i));
      Plan p;
      p.add(out.buf.tensor(), out.want, int64_t{i} * 4096, host_bytes(host), host, 0, 4096);
      ASSERT_TRUE(gpu->copy_many(p.regions).is_ok());
    }
    EXPECT_TRUE(cudatest::download_bytes(*gpu, out.buf.tensor()) == out.want) << "round " << round;
  }
  EXPECT_TRUE(cudatest::download_bytes(*gpu, b.buf.tensor()) == b.want);
}

TEST(CudaCopyMany, KeepsItsPlaceAmongOtherOpsAndInsideSteps) {
  PD_CUDA_OR_SKIP(gpu);
  std::mt19937 rng(19);
  DeviceBytes a = device_bytes(*gpu, rng, DType::kF32, 64, 256);
  DeviceBytes b = device_bytes(*gpu, rng, DType::kF32, 64, 256);
  DeviceBytes c = device_bytes(*gpu, rng, DType::kF32, 64, 256);
  // A queued copy, then copy_many reading its destination.
  ASSERT_TRUE(gpu->copy(b.buf.tensor(), a.buf.tensor()).is_ok());
  b.want = a.want;
  Plan p;
  p.add(c.buf.tensor(), c.want, 12, b.buf.tensor(), b.want, 100, 40000);
  ASSERT_TRUE(gpu->copy_many(p.regions).is_ok());
  EXPECT_TRUE(cudatest::download_bytes(*gpu, c.buf.tensor()) == c.want);
  // Inside a recorded step: after the ops recorded before it, before those after it.
  ASSERT_TRUE(gpu->begin_step().is_ok());
  ASSERT_TRUE(gpu->fill_zero(a.buf.tensor()).is_ok());
  std::fill(a.want.begin(), a.want.end(), 0);
  Plan q;
  q.add(b.buf.tensor(), b.want, 0, a.buf.tensor(), a.want, 0, 65536);
  ASSERT_TRUE(gpu->copy_many(q.regions).is_ok());
  ASSERT_TRUE(gpu->copy(c.buf.tensor(), b.buf.tensor()).is_ok());
  c.want = b.want;
  ASSERT_TRUE(gpu->end_step().is_ok());
  EXPECT_TRUE(cudatest::download_bytes(*gpu, b.buf.tensor()) == b.want);
  EXPECT_TRUE(cudatest::download_bytes(*gpu, c.buf.tensor()) == c.want);
}

// copy, fill_zero and upload (kernels since copy_plan.h's launch_copy_rows; uploads in a step read the
// mapped staging) on views of every alignment and pitch, against the same bytes moved on the host: outside a
// step, and in recorded steps, the last one replaying the graph of the one before with new uploaded bytes.
TEST(CudaStepCopies, ViewsOfEveryAlignment) {
  PD_CUDA_OR_SKIP(gpu);
  std::mt19937 rng(23);
  constexpr int64_t kRows = 37, kCols = 304;
  DeviceBytes src = device_bytes(*gpu, rng, DType::kU8, kRows, kCols);
  DeviceBytes dst = device_bytes(*gpu, rng, DType::kU8, kRows, kCols);
  struct View {
    int64_t row, rows, col, cols;
  };
  // Whole rows as one flat block, 16-, 8- and 4-byte aligned pieces, and odd ones.
  const View views[] = {{0, kRows, 0, kCols}, {5, 9, 16, 128}, {2, 7, 8, 40},  {1, 30, 4, 60},
                        {3, 11, 3, 37},       {0, 1, 1, 301},  {36, 1, 0, 304}};
  auto view = [](const Buffer& b, const View& v) {
    return b.tensor().row_slice(v.row, v.rows).col_slice(v.col, v.cols);
  };
  auto set = [&](std::vector<uint8_t>& want, const View& v, auto&& byte) {
    for (int64_t r = 0; r < v.rows; ++r) {
      for (int64_t c = 0; c < v.cols; ++c) {
        want[static_cast<size_t>((v.row + r) * kCols + v.col + c)] = byte(r, c);
      }
    }
  };
  // Run 0 outside a step; runs 1-3 as the same step: recorded (the first may run eagerly while the staging
  // grows), then replayed.
  CudaStepStats before_last;
  for (int run = 0; run < 4; ++run) {
    SCOPED_TRACE(run);
    if (run == 3) before_last = *cuda_step_stats(*gpu);
    if (run > 0) {
      ASSERT_TRUE(gpu->begin_step().is_ok());
    }
    for (size_t i = 0; i < std::size(views); ++i) {
      const View& v = views[i];
      // The copy's source view sits one row and 8 - i columns off the destination's, where it fits.
      const View from{(v.row + 1) % (kRows - v.rows + 1), v.rows,
                      (v.col + 8 - static_cast<int64_t>(i) + kCols) % (kCols - v.cols + 1), v.cols};
      ASSERT_TRUE(gpu->copy(view(dst.buf, v), view(src.buf, from)).is_ok());
      set(dst.want, v, [&](int64_t r, int64_t c) {
        return src.want[static_cast<size_t>((from.row + r) * kCols + from.col + c)];
      });
      if (i % 2 == 1) {
        ASSERT_TRUE(gpu->fill_zero(view(dst.buf, v)).is_ok());
        set(dst.want, v, [](int64_t, int64_t) { return uint8_t{0}; });
      }
      if (i % 3 == 2) {
        const std::vector<uint8_t> up = random_vector(rng, v.rows * v.cols);
        ASSERT_TRUE(gpu->upload(view(dst.buf, v), up.data()).is_ok());
        set(dst.want, v, [&](int64_t r, int64_t c) { return up[static_cast<size_t>(r * v.cols + c)]; });
      }
    }
    if (run > 0) {
      ASSERT_TRUE(gpu->end_step().is_ok());
    }
    EXPECT_TRUE(cudatest::download_bytes(*gpu, dst.buf.tensor()) == dst.want);
  }
  const CudaStepStats last = *cuda_step_stats(*gpu);
  EXPECT_EQ(last.graphs_captured - before_last.graphs_captured, 0) << "the last step should replay a graph";
  EXPECT_EQ(last.graph_replays - before_last.graph_replays, 1);
}

// A list between device tensors inside a step is a kernel of the step's graph (a rollback's GDN states): the
// replayed graph copies the sources' current bytes.
TEST(CudaCopyMany, DeviceListsInsideAStepReplayWithTheirGraph) {
  PD_CUDA_OR_SKIP(gpu);
  std::mt19937 rng(29);
  DeviceBytes a = device_bytes(*gpu, rng, DType::kU8, 1, 200000);
  DeviceBytes b = device_bytes(*gpu, rng, DType::kU8, 1, 200000);
  CudaStepStats before_last;
  for (int run = 0; run < 4; ++run) {
    SCOPED_TRACE(run);
    if (run == 3) before_last = *cuda_step_stats(*gpu);
    a.want = random_vector(rng, a.buf.nbytes());  // new sources for every run
    ASSERT_TRUE(gpu->upload(a.buf.tensor(), a.want.data()).is_ok());
    Plan p;
    p.add(b.buf.tensor(), b.want, 0, a.buf.tensor(), a.want, 0, 131072 + 5);  // pieces of 64 KB, a tail
    p.add(b.buf.tensor(), b.want, 140001, a.buf.tensor(), a.want, 150003, 999);
    p.add(b.buf.tensor(), b.want, 150016, a.buf.tensor(), a.want, 160032, 4096);
    ASSERT_TRUE(gpu->begin_step().is_ok());
    ASSERT_TRUE(gpu->copy_many(p.regions).is_ok());
    ASSERT_TRUE(gpu->end_step().is_ok());
    EXPECT_TRUE(cudatest::download_bytes(*gpu, b.buf.tensor()) == b.want);
  }
  const CudaStepStats last = *cuda_step_stats(*gpu);
  EXPECT_EQ(last.graphs_captured - before_last.graphs_captured, 0);
  EXPECT_EQ(last.graph_replays - before_last.graph_replays, 1);
  EXPECT_EQ(last.eager_steps - before_last.eager_steps, 0);
}

TEST(CudaCopyMany, RefusesBadListsBeforeCopyingAnything) {
  PD_CUDA_OR_SKIP(gpu);
  std::mt19937 rng(20);
  DeviceBytes a = device_bytes(*gpu, rng, DType::kU8, 1, 1000);
  DeviceBytes b = device_bytes(*gpu, rng, DType::kU8, 1, 1000);
  std::vector<CopyRegion> list = {
      {.dst = b.buf.tensor(), .dst_offset = 0, .src = a.buf.tensor(), .src_offset = 0, .bytes = 500},
      {.dst = b.buf.tensor(), .dst_offset = 600, .src = a.buf.tensor(), .src_offset = 900, .bytes = 101}};
  const Status s = gpu->copy_many(list);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("region 1 reads bytes [900, 1001)"), std::string::npos) << s.message();
  EXPECT_TRUE(cudatest::download_bytes(*gpu, b.buf.tensor()) == b.want) << "nothing copied";
  // The backend still works.
  list[1].src_offset = 899;
  ASSERT_TRUE(gpu->copy_many(list).is_ok());
}

}  // namespace
}  // namespace pd
