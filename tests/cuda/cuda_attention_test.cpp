// Gated attention on the CUDA backend (part of cuda_ops_tests): against the CPU backend (the reference,
// tested against naive implementations in cpu/attention_test.cpp) within tolerance, and against itself
// bitwise: every row of an R-row decode / verify step equals the one-row step at its position (R = 1..8, rows
// that straddle a change of split size, rewrites after a rewind), recorded steps replayed at other positions
// equal eager steps, and prefill results do not depend on how the prompt is cut at multiples of 64.
// Shapes: GQA groups 1, 2, 8, 16; head dims 128 and 256 (32 for prefill, the fixtures' size); bf16 and
// float32 caches. Skipped without a GPU.
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <random>

#include "cuda/cuda_test_util.h"
#include "puredrive/backend/cpu/test_util.h"
#include "puredrive/backend/cuda/attention_plan.h"
#include "puredrive/backend/cuda/cuda_backend.h"

namespace pd {
namespace {

using cudatest::download;
using cudatest::download_bytes;
using cudatest::rel_err;
using cudatest::rows_of;
using cudatest::same_bits;
using test::device_tensor;

struct Shape {
  int hq, hkv, d;
  int64_t qw() const { return int64_t{hq} * d; }
  int64_t kvw() const { return int64_t{hkv} * d; }
  AttentionDims dims() const {
    return {.num_heads = hq,
            .num_kv_heads = hkv,
            .head_dim = d,
            .rotary_dim = d / 4,
            .rope_theta = 1e7,
            .eps = 1e-6f};
  }
};

std::string describe(const Shape& s, DType kv) {
  return fmt::format("Hq {} Hkv {} D {} {} cache", s.hq, s.hkv, s.d, dtype_name(kv));
}

// The op's inputs for n rows at positions first .. first + n - 1; `seed` tells versions of the same
// positions apart (a rewrite after a rewind).
struct Rows {
  int first = 0, n = 0;
  std::vector<float> qg, k, v;
  std::vector<int32_t> pos;
};

Rows make_rows(const Shape& s, int first, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  Rows r;
  r.first = first;
  r.n = n;
  r.qg = test::random_vector(rng, static_cast<size_t>(n * 2 * s.qw()));
  r.k = test::random_vector(rng, static_cast<size_t>(n * s.kvw()));
  r.v = test::random_vector(rng, static_cast<size_t>(n * s.kvw()));
  for (int i = 0; i < n; ++i) r.pos.push_back(first + i);
  return r;
}

// Rows [i, i + n) of r.
Rows sub(const Shape& s, const Rows& r, int i, int n) {
  return {.first = r.first + i,
          .n = n,
          .qg = rows_of(r.qg, 2 * s.qw(), i, n),
          .k = rows_of(r.k, s.kvw(), i, n),
          .v = rows_of(r.v, s.kvw(), i, n),
          .pos = rows_of(r.pos, 1, i, n)};
}

class CudaAttention : public cudatest::GpuAndCpu {
 protected:
  // One backend's view of a layer: its norms and caches (capacity entries; the first `prefix` hold the same
  // random keys and values on every backend, written directly).
  struct Side {
    Backend* be = nullptr;
    VectorId qn, kn;
    std::vector<Buffer> keep;
    KvCache cache;
  };

  Side side(Backend& be, const Shape& s, DType kv, int64_t capacity, int prefix) {
    Side o;
    o.be = &be;
    std::mt19937 rng(77);
    // Norm weights of about 1.5 make the softmax peaked, so a misplaced key or value shows in the output.
    const std::vector<float> qn = test::random_vector(rng, static_cast<size_t>(s.d), 1.5f);
    const std::vector<float> kn = test::random_vector(rng, static_cast<size_t>(s.d), 1.5f);
    o.qn = be.bind_vector(qn, "q_norm").value();
    o.kn = be.bind_vector(kn, "k_norm").value();
    o.keep.push_back(be.alloc(kv, capacity, s.kvw()).value());
    o.keep.push_back(be.alloc(kv, capacity, s.kvw()).value());
    o.cache = {.k = o.keep[0].tensor(), .v = o.keep[1].tensor()};
    if (prefix > 0) {
      const std::vector<float> k = test::random_vector(rng, static_cast<size_t>(prefix * s.kvw()), 1.5f);
      const std::vector<float> v = test::random_vector(rng, static_cast<size_t>(prefix * s.kvw()));
      for (auto [t, host] : {std::pair{o.cache.k, &k}, std::pair{o.cache.v, &v}}) {
        const Tensor dst = t.row_slice(0, prefix);
        if (kv == DType::kF32) {
          EXPECT_TRUE(be.upload(dst, host->data()).is_ok());
        } else {
          std::vector<uint16_t> b(host->size());
          for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16((*host)[i]);
          EXPECT_TRUE(be.upload(dst, b.data()).is_ok());
        }
      }
    }
    return o;
  }

  // Runs the op over r on one side and returns its output.
  std::vector<float> run(const Side& sd, const Shape& s, const Rows& r) {
    Backend& be = *sd.be;
    Buffer bqg = device_tensor(be, DType::kF32, r.n, 2 * s.qw(), r.qg);
    Buffer bk = device_tensor(be, DType::kF32, r.n, s.kvw(), r.k);
    Buffer bv = device_tensor(be, DType::kF32, r.n, s.kvw(), r.v);
    Buffer bp = device_tensor(be, DType::kI32, r.n, 1, r.pos);
    Buffer out = device_tensor(be, DType::kF32, r.n, s.qw(), std::vector<float>{});
    const Status st = be.gated_attention({.dims = s.dims(),
                                          .qg = bqg.tensor(),
                                          .k = bk.tensor(),
                                          .v = bv.tensor(),
                                          .q_norm = sd.qn,
                                          .k_norm = sd.kn,
                                          .positions = bp.tensor(),
                                          .kv_length = r.first + r.n,
                                          .cache = sd.cache,
                                          .out = out.tensor()});
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return download<float>(be, out.tensor());
  }

  // Cache entries [begin, begin + n) of a GPU side, keys then values, as bytes.
  std::vector<uint8_t> entries(const Side& sd, int begin, int n) {
    std::vector<uint8_t> k = download_bytes(*sd.be, sd.cache.k.row_slice(begin, n));
    const std::vector<uint8_t> v = download_bytes(*sd.be, sd.cache.v.row_slice(begin, n));
    k.insert(k.end(), v.begin(), v.end());
    return k;
  }

  // The R-row step on `multi` against the CPU (tolerance) and against one-row steps on `single` (bitwise:
  // outputs and the cache entries written).
  void check_step(Side& cpu, Side& multi, Side& single, const Shape& s, DType kv, const Rows& r,
                  const std::string& what) {
    SCOPED_TRACE(what);
    const std::vector<float> want = run(cpu, s, r);
    const std::vector<float> got = run(multi, s, r);
    EXPECT_LE(rel_err(got, want), kv == DType::kF32 ? 1e-4 : 2e-3) << "against the CPU";
    for (int i = 0; i < r.n; ++i) {
      const std::vector<float> one = run(single, s, sub(s, r, i, 1));
      EXPECT_TRUE(same_bits(one, rows_of(got, s.qw(), i, 1)))
          << "row " << i << " (position " << r.first + i << ") differs from the one-row step";
    }
    EXPECT_TRUE(entries(multi, r.first, r.n) == entries(single, r.first, r.n)) << "cache entries";
  }
};

// Rows placed around the position where the split size doubles (64 * attn_max_splits keys): a verify step
// of 8 rows then mixes two split sizes, and its rows straddle split and tile boundaries.
TEST_F(CudaAttention, DecodeRowsEqualOneRowStepsAcrossSplits) {
  const std::vector<Shape> shapes = {{16, 2, 256}, {16, 16, 128}, {4, 2, 128}, {16, 1, 128}};
  for (const Shape& s : shapes) {
    if (cudatest::small() && &s != &shapes[1]) continue;
    if (cudatest::quick() && &s > &shapes[1]) continue;  // under memcheck: the 35B shape and group 1
    const int first = cuda::kAttnTile * cuda::attn_max_splits(s.hkv) - 4;
    ASSERT_NE(cuda::attn_split_size(first, s.hkv), cuda::attn_split_size(first + 7, s.hkv));
    ASSERT_GT(cuda::attn_num_splits(first, s.hkv), 8);
    for (DType kv : {DType::kBF16, DType::kF32}) {
      SCOPED_TRACE(describe(s, kv));
      Side cpu = side(*cpu_, s, kv, first + 16, first);
      Side multi = side(*gpu_, s, kv, first + 16, first), single = side(*gpu_, s, kv, first + 16, first);
      for (int R = 1; R <= 8; ++R) {
        if (cudatest::quick() && R != 1 && R != 3 && R != 8) continue;
        check_step(cpu, multi, single, s, kv, make_rows(s, first, R, 100 + R), fmt::format("R = {}", R));
      }
      // Write 8 rows, roll back to the third, rewrite 6 rows with other inputs: the rewritten rows cross the
      // change of split size, and the entries they replace held other keys.
      check_step(cpu, multi, single, s, kv, make_rows(s, first, 8, 200), "before the rewind");
      check_step(cpu, multi, single, s, kv, make_rows(s, first + 2, 6, 300), "rewritten after the rewind");
    }
  }
}

// Short contexts: while the items of all rows fit the grid one row at a time, each block of a GQA-8 step
// takes one (item, row) pair (attention_decode.cu), and past that one item for all rows. Rows before, across
// and past that switch (on a 132-SM GPU near 44 one-tile splits for 3 rows, 16 for 8 rows) equal one-row
// steps bitwise.
TEST_F(CudaAttention, DecodeRowsEqualOneRowStepsAtShortContexts) {
  const std::vector<Shape> shapes = {{16, 2, 256}, {32, 4, 128}};
  for (const Shape& s : shapes) {
    if (cudatest::small() && &s != &shapes[0]) continue;
    const int capacity = 3200;
    Side cpu = side(*cpu_, s, DType::kBF16, capacity, capacity - 16);
    Side multi = side(*gpu_, s, DType::kBF16, capacity, capacity - 16);
    Side single = side(*gpu_, s, DType::kBF16, capacity, capacity - 16);
    SCOPED_TRACE(describe(s, DType::kBF16));
    for (int R = 2; R <= 8; ++R) {
      if (cudatest::quick() && R != 3 && R != 8) continue;
      check_step(cpu, multi, single, s, DType::kBF16, make_rows(s, 100, R, 600 + R),
                 fmt::format("R = {} at 100", R));
    }
    for (const int first : {1000, 1020, 2800, 2830}) {
      for (const int R : {3, 8}) {
        check_step(cpu, multi, single, s, DType::kBF16, make_rows(s, first, R, 700 + R),
                   fmt::format("R = {} at {}", R, first));
      }
    }
  }
}

// One graph serves every position: a recorded 3-row step replayed at positions across the change of split
// size gives the bits of eager one-row steps.
TEST_F(CudaAttention, RecordedDecodeStepReplaysAcrossSplitSizes) {
  const Shape s{16, 2, 256};
  const int R = 3, boundary = cuda::kAttnTile * cuda::attn_max_splits(s.hkv);
  const int begin = boundary - 9, steps = cudatest::quick() ? 2 : 6;
  Side rec = side(*gpu_, s, DType::kBF16, boundary + 16, begin);
  Side eager = side(*gpu_, s, DType::kBF16, boundary + 16, begin);
  Buffer bqg = gpu_->alloc(DType::kF32, R, 2 * s.qw()).value(),
         bk = gpu_->alloc(DType::kF32, R, s.kvw()).value(), bv = gpu_->alloc(DType::kF32, R, s.kvw()).value(),
         bp = gpu_->alloc(DType::kI32, R, 1).value(), out = gpu_->alloc(DType::kF32, R, s.qw()).value();
  const CudaStepStats before = cuda_step_stats(*gpu_).value();
  for (int i = 0; i < steps; ++i) {
    const Rows r = make_rows(s, begin + R * i, R, 400 + i);
    ASSERT_TRUE(gpu_->begin_step().is_ok());
    EXPECT_TRUE(gpu_->upload(bqg.tensor(), r.qg.data()).is_ok());
    EXPECT_TRUE(gpu_->upload(bk.tensor(), r.k.data()).is_ok());
    EXPECT_TRUE(gpu_->upload(bv.tensor(), r.v.data()).is_ok());
    EXPECT_TRUE(gpu_->upload(bp.tensor(), r.pos.data()).is_ok());
    EXPECT_TRUE(gpu_->gated_attention({.dims = s.dims(),
                                       .qg = bqg.tensor(),
                                       .k = bk.tensor(),
                                       .v = bv.tensor(),
                                       .q_norm = rec.qn,
                                       .k_norm = rec.kn,
                                       .positions = bp.tensor(),
                                       .cache = rec.cache,
                                       .out = out.tensor()})
                    .is_ok());
    ASSERT_TRUE(gpu_->end_step().is_ok());
    const std::vector<float> got = download<float>(*gpu_, out.tensor());
    for (int j = 0; j < R; ++j) {
      EXPECT_TRUE(same_bits(run(eager, s, sub(s, r, j, 1)), rows_of(got, s.qw(), j, 1)))
          << "step " << i << " row " << j << " (position " << r.first + j << ")";
    }
  }
  const CudaStepStats after = cuda_step_stats(*gpu_).value();
  if (std::getenv("PD_CUDA_GRAPHS") == nullptr) {
    // The first step runs eagerly when it grows the upload staging (a graph would keep the old address);
    // every other step replays the one graph.
    const int64_t eager_runs = after.eager_steps - before.eager_steps;
    EXPECT_LE(eager_runs, 1);
    EXPECT_EQ(after.graphs_captured - before.graphs_captured, 1);
    EXPECT_EQ(after.graph_replays - before.graph_replays + eager_runs, steps);
  }
}

// Prefill steps (more than 8 rows) against the CPU: from an empty cache, then a second step that starts off
// the 64-position grid, then a one-row step reading everything.
TEST_F(CudaAttention, PrefillMatchesCpu) {
  const std::vector<Shape> shapes = {{16, 2, 256}, {16, 16, 128}, {4, 2, 128}, {16, 1, 128}, {4, 2, 32}};
  for (const Shape& s : shapes) {
    if (cudatest::small() && &s != &shapes[1]) continue;
    for (DType kv : {DType::kBF16, DType::kF32}) {
      SCOPED_TRACE(describe(s, kv));
      Side cpu = side(*cpu_, s, kv, 320, 0), gpu = side(*gpu_, s, kv, 320, 0);
      // bf16 caches take the flash kernel, which rounds queries and probabilities to bf16.
      const double tol = kv == DType::kF32 ? 1e-4 : 1.5e-2;
      const Rows a = make_rows(s, 0, 150, 500), b = make_rows(s, 150, 137, 501),
                 c = make_rows(s, 287, 1, 502);
      for (const Rows* r : {&a, &b, &c}) {
        const std::vector<float> want = run(cpu, s, *r), got = run(gpu, s, *r);
        EXPECT_LE(rel_err(got, want), r->n == 1 && kv == DType::kBF16 ? 2e-3 : tol)
            << r->n << " rows at position " << r->first;
      }
    }
  }
}

// The same 300-row prompt in one step and cut at multiples of 64 into steps of more than 8 rows: outputs and
// cache bitwise identical (docs/DESIGN.md §4.6).
TEST_F(CudaAttention, PrefillIsChunkInvariant) {
  const std::vector<Shape> shapes = {{16, 2, 256}, {16, 16, 128}, {16, 1, 128}};
  const int n = 300;
  const std::vector<std::vector<int>> cuts = {{64}, {128, 192}, {256}, {64, 128, 192, 256}};
  for (const Shape& s : shapes) {
    if (cudatest::small() && &s != &shapes[1]) continue;
    for (DType kv : {DType::kBF16, DType::kF32}) {
      SCOPED_TRACE(describe(s, kv));
      const Rows all = make_rows(s, 0, n, 600);
      Side ref = side(*gpu_, s, kv, n, 0);
      const std::vector<float> whole = run(ref, s, all);
      for (const std::vector<int>& cut : cuts) {
        Side g = side(*gpu_, s, kv, n, 0);
        std::vector<float> pieces;
        int begin = 0;
        for (size_t i = 0; i <= cut.size(); ++i) {
          const int end = i < cut.size() ? cut[i] : n;
          const std::vector<float> o = run(g, s, sub(s, all, begin, end - begin));
          pieces.insert(pieces.end(), o.begin(), o.end());
          begin = end;
        }
        EXPECT_TRUE(same_bits(pieces, whole)) << "outputs, cut at " << fmt::format("{}", fmt::join(cut, ","));
        EXPECT_TRUE(entries(g, 0, n) == entries(ref, 0, n)) << "cache";
      }
    }
  }
}

}  // namespace
}  // namespace pd
