// Weight uploads through the staged, multi-threaded path (backend/cuda/weight_upload.h): matrices larger than
// several staging chunks, from a memory-mapped file (read with pread) and from ordinary memory, must arrive
// in device memory byte for byte. Checked through matmul: one-hot input rows pick columns of every weight row
// exactly (0 * w and 1 * w are exact), and random rows are compared with the CPU backend, which uses the host
// bytes in place. (Stacked experts take the same path; cuda_model_tests binds them from the fixtures' files.)
// Skipped without a GPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "cuda/cuda_test_util.h"
#include "puredrive/backend/cpu/test_util.h"
#include "puredrive/util/mapped_file.h"

namespace pd {
namespace {

using cudatest::download;
using cudatest::rel_err;
using test::device_tensor;

// The matrix's bytes copied into a file, and a view of them through its mapping at an odd-sized offset.
struct MappedMatrix {
  std::string path;
  std::shared_ptr<MappedFile> file;
  Matrix m;
  ~MappedMatrix() { std::filesystem::remove(path); }
};

std::unique_ptr<MappedMatrix> map_copy(const test::OwnedMatrix& o) {
  auto mm = std::make_unique<MappedMatrix>();
  const char* base = std::getenv("TMPDIR");
  mm->path = std::string(base != nullptr ? base : "/tmp") + "/pd_cuda_upload_XXXXXX";
  const int fd = ::mkstemp(mm->path.data());
  EXPECT_GE(fd, 0);
  // 4096 + 8 bytes of padding first, so that no part starts on a page or chunk boundary.
  const std::vector<uint8_t> pad(4104, 0);
  size_t off = 0;
  std::vector<size_t> at;
  for (const std::vector<uint8_t>* part : {&pad, &o.data, &o.scales, &o.biases}) {
    at.push_back(off);
    EXPECT_EQ(::write(fd, part->data(), part->size()), static_cast<ssize_t>(part->size()));
    off += part->size();
  }
  ::close(fd);
  mm->file = MappedFile::open(mm->path).value();
  mm->m = o.m;
  mm->m.data = mm->file->data() + at[1];
  if (o.m.format == WeightFormat::kAffine) {
    mm->m.scales = mm->file->data() + at[2];
    mm->m.biases = mm->file->data() + at[3];
  }
  return mm;
}

class CudaUpload : public cudatest::GpuAndCpu {
 protected:
  // Columns picked by one-hot rows equal the reference bitwise; random rows agree with the CPU backend.
  void expect_uploaded(const Matrix& m, const std::vector<float>& reference) {
    const MatrixId wg = gpu_->bind_matrix(m).value();
    const MatrixId wc = cpu_->bind_matrix(m).value();
    const int64_t N = m.rows, K = m.cols;
    const std::vector<int64_t> cols = {0, 1, K / 2 + 3, K - 1};
    std::vector<float> x(cols.size() * static_cast<size_t>(K), 0.0f);
    for (size_t r = 0; r < cols.size(); ++r)
      x[r * static_cast<size_t>(K) + static_cast<size_t>(cols[r])] = 1.0f;
    const int R = static_cast<int>(cols.size());
    Buffer xg = device_tensor(*gpu_, DType::kF32, R, K, x);
    Buffer og = gpu_->alloc(DType::kF32, R, N).value();
    ASSERT_TRUE(gpu_->matmul({.w = wg, .x = xg.tensor(), .out = og.tensor()}).is_ok());
    const std::vector<float> got = download<float>(*gpu_, og.tensor());
    int64_t bad = 0;
    for (size_t r = 0; r < cols.size(); ++r) {
      for (int64_t n = 0; n < N; ++n) {
        bad += got[r * static_cast<size_t>(N) + static_cast<size_t>(n)] !=
               reference[static_cast<size_t>(n * K + cols[r])];
      }
    }
    EXPECT_EQ(bad, 0) << "weights differ from the host bytes";
    const std::vector<float> xr = test::random_vector(rng_, static_cast<size_t>(2 * K));
    Buffer xg2 = device_tensor(*gpu_, DType::kF32, 2, K, xr),
           xc2 = device_tensor(*cpu_, DType::kF32, 2, K, xr);
    Buffer og2 = gpu_->alloc(DType::kF32, 2, N).value(), oc2 = cpu_->alloc(DType::kF32, 2, N).value();
    ASSERT_TRUE(gpu_->matmul({.w = wg, .x = xg2.tensor(), .out = og2.tensor()}).is_ok());
    ASSERT_TRUE(cpu_->matmul({.w = wc, .x = xc2.tensor(), .out = oc2.tensor()}).is_ok());
    // bf16 weights run on the tensor cores (activations split into bf16 hi + lo): their tolerance.
    EXPECT_LE(rel_err(download<float>(*gpu_, og2.tensor()), download<float>(*cpu_, oc2.tensor())),
              cudatest::kMmaTolerance);
  }

  std::mt19937 rng_{99};
};

// 4100 x 4096 bf16 is 33.6 MB: three staging chunks and a partial one.
TEST_F(CudaUpload, LargeBf16MatrixFromAMappedFile) {
  auto o = test::make_matrix(rng_, 4100, 4096, WeightFormat::kBF16);
  auto mm = map_copy(*o);
  expect_uploaded(mm->m, o->reference);
}

TEST_F(CudaUpload, LargeAffineMatrixFromMemoryAndFromAMappedFile) {
  auto o = test::make_matrix(rng_, 8200, 4096, WeightFormat::kAffine, 8, 64);
  expect_uploaded(o->m, o->reference);
  auto mm = map_copy(*o);
  expect_uploaded(mm->m, o->reference);
}

}  // namespace
}  // namespace pd
