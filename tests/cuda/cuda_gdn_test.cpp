// The CUDA Gated DeltaNet prefill kernels (gdn_prefill.cu, the chunked form of spec §5.7) against the CPU
// backend: its token-by-token recurrence (the reference of the decode path) and its chunked form (the same
// math in the same order, so the two differ only by expf), on several shapes including the Qwen3.5-35B one,
// partial first and last chunks, steps longer than a segment of kGdnSegmentChunks chunks and a fast- and a
// slow-forgetting decay. Chunking invariance on the GPU: prefill pieces split at multiples of 64 positions,
// of any row count, give bitwise the outputs and states of one piece; recorded steps (CUDA graphs) replay
// the right chunk boundaries. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "cuda/cuda_test_util.h"
#include "puredrive/backend/cpu/gdn_test_util.h"
#include "puredrive/backend/cuda/kernels.h"

namespace pd {
namespace {

using cudatest::rel_err;
using cudatest::same_bits;
using test::GdnCase;
using test::GdnPiece;
using test::GdnRun;

struct Shape {
  GdnDims dims;
  float decay;  // test::make_gdn_case
  const char* name;
};

GdnDims dims(int hk, int hv, int dk, int dv) {
  return {.num_k_heads = hk,
          .num_v_heads = hv,
          .k_head_dim = dk,
          .v_head_dim = dv,
          .conv_kernel = 4,
          .eps = 1e-6f};
}

// Every key head dim the kernels are instantiated for, value head dims below, at and above one block of 32
// state columns, GQA ratios 1-3.
const Shape kShapes[] = {
    {dims(2, 4, 16, 16), 1.0f, "Dk 16 Dv 16"},
    {dims(2, 4, 16, 16), 0.01f, "Dk 16 Dv 16 slow decay"},
    {dims(1, 3, 32, 40), 0.02f, "Dk 32 Dv 40"},
    {dims(2, 2, 64, 64), 8.0f, "Dk 64 Dv 64 fast decay (tiny coder)"},
    {dims(1, 2, 128, 32), 0.05f, "Dk 128 Dv 32"},
    {dims(16, 32, 128, 128), 0.05f, "Qwen3.5-35B: Hk 16 Hv 32 Dk Dv 128"},
    {dims(1, 2, 256, 72), 0.02f, "Dk 256 Dv 72"},
};

// Max relative error (max |a - ref| / max |ref|) of the GPU prefill against the CPU: the recurrence differs
// in summation order all along the step (measured about 1e-6 on the CPU's own chunked form), the CPU's
// chunked form only by expf.
constexpr double kVsRecurrence = 1e-4;
constexpr double kVsCpuChunked = 5e-5;

class CudaGdnPrefill : public cudatest::GpuAndCpu {
 protected:
  CudaGdnPrefill() : GpuAndCpu(8) {}
  std::mt19937 rng_{4321};
};

void expect_close(const GdnRun& got, const GdnRun& want, double tol, const std::string& what) {
  const double out = rel_err(got.out, want.out), state = rel_err(got.recurrent, want.recurrent);
  EXPECT_LE(out, tol) << what << ": outputs";
  EXPECT_LE(state, tol) << what << ": recurrent state";
  // The conv state is the last inputs, copied.
  EXPECT_TRUE(same_bits(got.conv, want.conv)) << what << ": conv state";
  std::printf("  %s: max rel err outputs %.3g, state %.3g\n", what.c_str(), out, state);
}

void expect_same(const GdnRun& got, const GdnRun& want, const std::string& what) {
  EXPECT_TRUE(same_bits(got.out, want.out)) << what << ": outputs";
  EXPECT_TRUE(same_bits(got.conv, want.conv)) << what << ": conv state";
  EXPECT_TRUE(same_bits(got.recurrent, want.recurrent)) << what << ": recurrent state";
}

// From position 0 (150 rows: two full chunks and a partial one) and after 37 decode rows (chunks [37, 64),
// [64, 128), [128, 150)); the GPU against the CPU recurrence over all rows and the CPU chunked form over the
// same pieces.
TEST_F(CudaGdnPrefill, MatchesCpuRecurrenceAndChunkedForm) {
  for (const Shape& shape : kShapes) {
    // Under the sanitizers (quick, small) the 35B shape is left out; the others cover every kernel variant.
    if ((cudatest::quick() || cudatest::small()) && shape.dims.num_v_heads > 4) continue;
    SCOPED_TRACE(shape.name);
    std::printf("%s\n", shape.name);
    const GdnCase c = test::make_gdn_case(rng_, 150, shape.dims, shape.decay);
    const GdnRun ref = test::run_gdn(*cpu_, c, test::gdn_pieces({150}, false));
    const std::vector<std::vector<GdnPiece>> splits = {
        test::gdn_pieces({150}, true), {{.rows = 37, .prefill = false}, {.rows = 113, .prefill = true}}};
    for (const std::vector<GdnPiece>& pieces : splits) {
      const std::string from = pieces.front().prefill ? "from 0" : "from 37";
      const GdnRun gpu = test::run_gdn(*gpu_, c, pieces);
      expect_close(gpu, ref, kVsRecurrence, "GPU prefill vs CPU recurrence, " + from);
      expect_close(gpu, test::run_gdn(*cpu_, c, pieces), kVsCpuChunked, "GPU vs CPU prefill, " + from);
    }
  }
}

// Steps longer than one segment of kGdnSegmentChunks chunks (1100 rows: segments of 1024 and 76 rows), at the
// 35B shape and a small one, against the CPU's chunked form; then decode rows on the GPU continue from the
// prefilled state as the CPU's do.
TEST_F(CudaGdnPrefill, LongStepsCrossSegments) {
  static_assert(cuda::kGdnSegmentChunks * cuda::kGdnPrefillChunk < 1100);
  for (const Shape& shape : {kShapes[1], kShapes[5]}) {
    if (cudatest::quick() && shape.dims.num_v_heads > 4) continue;
    SCOPED_TRACE(shape.name);
    std::printf("%s\n", shape.name);
    const GdnCase c = test::make_gdn_case(rng_, 1104, shape.dims, shape.decay);
    for (const std::vector<GdnPiece>& pieces :
         {std::vector<GdnPiece>{{.rows = 1100, .prefill = true}, {.rows = 4, .prefill = false}},
          std::vector<GdnPiece>{{.rows = 10, .prefill = false},
                                {.rows = 1090, .prefill = true},
                                {.rows = 4, .prefill = false}}}) {
      const GdnRun cpu = test::run_gdn(*cpu_, c, pieces);
      const GdnRun gpu = test::run_gdn(*gpu_, c, pieces);
      expect_close(gpu, cpu, kVsCpuChunked, pieces.size() == 2 ? "1100 rows from 0" : "1090 rows from 10");
    }
  }
}

// Pieces split at multiples of 64 positions give the bits of one piece, from position 0 and after 37 decode
// rows, whatever their row count (pieces of up to 8 rows take the prefill kernels too) and across segments.
TEST_F(CudaGdnPrefill, ChunkingInvariance) {
  struct Split {
    int64_t tokens;
    std::vector<std::vector<GdnPiece>> runs;  // the first is the reference
  };
  auto prefill = [](std::initializer_list<int64_t> rows) { return test::gdn_pieces(rows, true); };
  auto after37 = [](std::initializer_list<int64_t> rows) {
    std::vector<GdnPiece> p = {{.rows = 37, .prefill = false}};
    for (int64_t n : rows) p.push_back({.rows = n, .prefill = true});
    return p;
  };
  const std::vector<Split> splits = {
      {300, {prefill({300}), prefill({128, 172}), prefill({64, 64, 64, 64, 44})}},
      {300, {after37({263}), after37({91, 172}), after37({27, 64, 64, 64, 44})}},
      {69, {after37({32}), after37({27, 5})}},
      {1100, {prefill({1100}), prefill({512, 588}), prefill({64, 1036})}},
  };
  for (const Shape& shape : {kShapes[0], kShapes[5], kShapes[6]}) {
    SCOPED_TRACE(shape.name);
    for (const Split& split : splits) {
      if (cudatest::quick() && (split.tokens > 300 || shape.dims.num_v_heads > 4)) continue;
      const GdnCase c = test::make_gdn_case(rng_, split.tokens, shape.dims, shape.decay);
      const GdnRun one = test::run_gdn(*gpu_, c, split.runs.front());
      for (size_t i = 1; i < split.runs.size(); ++i) {
        expect_same(test::run_gdn(*gpu_, c, split.runs[i]), one,
                    fmt::format("{} tokens, split {}", split.tokens, i));
      }
    }
  }
  // Not vacuous: a split off the 64-position grid moves the chunk boundaries and changes the bits.
  const GdnCase c = test::make_gdn_case(rng_, 300, kShapes[1].dims, kShapes[1].decay);
  const GdnRun one = test::run_gdn(*gpu_, c, prefill({300}));
  const GdnRun off = test::run_gdn(*gpu_, c, prefill({100, 200}));
  EXPECT_FALSE(same_bits(off.recurrent, one.recurrent));
  EXPECT_LE(rel_err(off.out, one.out), kVsRecurrence);
}

// A recorded prefill step (CUDA graph) equals the eager one, and a step with the same tensors at another
// position modulo 64 is not served by the first one's graph.
TEST_F(CudaGdnPrefill, RecordedStepsEqualEagerAndKeepTheirChunkBoundaries) {
  const Shape& shape = kShapes[4];
  const GdnCase c = test::make_gdn_case(rng_, 200, shape.dims, shape.decay);
  for (const std::vector<GdnPiece>& pieces :
       {test::gdn_pieces({200}, true),
        std::vector<GdnPiece>{{.rows = 5, .prefill = false}, {.rows = 195, .prefill = true}},
        std::vector<GdnPiece>{{.rows = 37, .prefill = false}, {.rows = 163, .prefill = true}}}) {
    const GdnRun eager = test::run_gdn(*gpu_, c, pieces);
    const GdnRun recorded = test::run_gdn(*gpu_, c, pieces, /*record=*/true);
    expect_same(recorded, eager, fmt::format("recorded, first piece of {} rows", pieces.front().rows));
  }
  // The same arguments but the position: one backend, one set of buffers, two recorded steps.
  const GdnDims& d = shape.dims;
  const int64_t C = c.channels(), vd = c.value_dim(), hv = d.num_v_heads, n = 100;
  Backend& be = *gpu_;
  const VectorId conv1d = be.bind_vector(c.conv1d, "conv1d").value();
  const VectorId a_log = be.bind_vector(c.A_log, "A_log").value();
  const VectorId dt = be.bind_vector(c.dt_bias, "dt_bias").value();
  const VectorId norm = be.bind_vector(c.norm, "norm").value();
  Buffer qkv = test::device_tensor(be, DType::kF32, n, C, cudatest::rows_of(c.qkv, C, 0, n));
  Buffer z = test::device_tensor(be, DType::kF32, n, vd, cudatest::rows_of(c.z, vd, 0, n));
  Buffer b = test::device_tensor(be, DType::kF32, n, hv, cudatest::rows_of(c.b, hv, 0, n));
  Buffer a = test::device_tensor(be, DType::kF32, n, hv, cudatest::rows_of(c.a, hv, 0, n));
  Buffer out = be.alloc(DType::kF32, n, vd).value();
  Buffer conv = be.alloc(DType::kF32, d.conv_kernel - 1, C).value();
  Buffer rec = be.alloc(DType::kF32, hv, c.state_size()).value();
  auto step = [&](int32_t position, bool record) {
    EXPECT_TRUE(be.fill_zero(conv.tensor()).is_ok());
    EXPECT_TRUE(be.fill_zero(rec.tensor()).is_ok());
    if (record) {
      EXPECT_TRUE(be.begin_step().is_ok());
    }
    const Status s = be.gated_delta_net({.dims = d,
                                         .qkv = qkv.tensor(),
                                         .z = z.tensor(),
                                         .b = b.tensor(),
                                         .a = a.tensor(),
                                         .conv1d = conv1d,
                                         .A_log = a_log,
                                         .dt_bias = dt,
                                         .norm = norm,
                                         .state = {.conv = conv.tensor(), .recurrent = rec.tensor()},
                                         .snapshots = {},
                                         .out = out.tensor(),
                                         .prefill = true,
                                         .position = position});
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    if (record) {
      EXPECT_TRUE(be.end_step().is_ok());
    }
    GdnRun r;
    r.out = test::to_host(be, out.tensor());
    r.conv = test::to_host(be, conv.tensor());
    r.recurrent = test::to_host(be, rec.tensor());
    return r;
  };
  const GdnRun eager0 = step(0, false), eager37 = step(37, false), eager101 = step(101, false);
  EXPECT_FALSE(same_bits(eager0.recurrent, eager37.recurrent)) << "the position moves the chunk boundaries";
  expect_same(eager101, eager37, "positions 37 and 101 (same offset in the chunk)");
  expect_same(step(0, true), eager0, "recorded at position 0");
  expect_same(step(37, true), eager37, "recorded at position 37 after position 0");
  expect_same(step(0, true), eager0, "recorded at position 0 again");
}

TEST_F(CudaGdnPrefill, BadPrefillArgumentsAreErrors) {
  const GdnCase c = test::make_gdn_case(rng_, 4, kShapes[0].dims, 1.0f);
  const GdnDims& d = c.dims;
  Backend& be = *gpu_;
  Buffer x = test::device_tensor(be, DType::kF32, 4, c.channels(), c.qkv);
  Buffer z = test::device_tensor(be, DType::kF32, 4, c.value_dim(), c.z);
  Buffer ba = test::device_tensor(be, DType::kF32, 4, d.num_v_heads, c.b);
  Buffer out = be.alloc(DType::kF32, 4, c.value_dim()).value();
  Buffer conv = be.alloc(DType::kF32, d.conv_kernel - 1, c.channels()).value();
  Buffer rec = be.alloc(DType::kF32, d.num_v_heads, c.state_size()).value();
  Buffer sconv = be.alloc(DType::kF32, 8, (d.conv_kernel - 1) * c.channels()).value();
  Buffer srec = be.alloc(DType::kF32, 8, d.num_v_heads * c.state_size()).value();
  GatedDeltaNetArgs args{.dims = d,
                         .qkv = x.tensor(),
                         .z = z.tensor(),
                         .b = ba.tensor(),
                         .a = ba.tensor(),
                         .conv1d = be.bind_vector(c.conv1d, "conv1d").value(),
                         .A_log = be.bind_vector(c.A_log, "A_log").value(),
                         .dt_bias = be.bind_vector(c.dt_bias, "dt_bias").value(),
                         .norm = be.bind_vector(c.norm, "norm").value(),
                         .state = {.conv = conv.tensor(), .recurrent = rec.tensor()},
                         .snapshots = {.conv = sconv.tensor(), .recurrent = srec.tensor()},
                         .out = out.tensor(),
                         .prefill = true,
                         .position = 0};
  EXPECT_NE(be.gated_delta_net(args).to_string().find("snapshots"), std::string::npos);
  args.snapshots = {};
  args.position = -3;
  EXPECT_NE(be.gated_delta_net(args).to_string().find("position -3"), std::string::npos);
  args.position = 3;
  EXPECT_TRUE(be.gated_delta_net(args).is_ok());
  EXPECT_TRUE(be.synchronize().is_ok());
}

}  // namespace
}  // namespace pd
