// The prefill kernels of the CUDA backend (MatmulArgs::prefill; gemm_mma.cu, moe_grouped.cu) against the CPU
// backend and an independent double-precision product, and their contract (docs/DESIGN.md §4.6): a row's
// result is bitwise the same whatever the number of rows of the call and the row's place in it, and the same
// from run to run. Also the counting sort of the grouped MoE against its host reference, and recorded
// (graph) prefill steps against eager ones. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>

#include "cuda/cuda_test_util.h"
#include "puredrive/backend/cpu/test_util.h"
#include "puredrive/backend/cuda/cuda_backend.h"
#include "puredrive/backend/cuda/kernels.h"
#include "puredrive/backend/cuda/moe_partition.h"

namespace pd {
namespace {

using cudatest::describe;
using cudatest::download;
using cudatest::FormatCase;
using cudatest::kMmaTolerance;
using cudatest::make_moe;
using cudatest::MoeFixture;
using cudatest::rel_err;
using cudatest::rows_of;
using cudatest::same_bits;
using test::device_tensor;

class CudaPrefill : public cudatest::GpuAndCpu {
 protected:
  // x [R, K] . w^T on the GPU as a prefill product, into out initialised to init ([R, N]).
  std::vector<float> gpu_matmul(MatrixId w, const std::vector<float>& x, int R, int64_t K, int64_t N,
                                const std::vector<float>& init, Accum acc) {
    Buffer xg = device_tensor(*gpu_, DType::kF32, R, K, x);
    Buffer og = device_tensor(*gpu_, DType::kF32, R, N, init);
    const Status s =
        gpu_->matmul({.w = w, .x = xg.tensor(), .out = og.tensor(), .accum = acc, .prefill = true});
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    return download<float>(*gpu_, og.tensor());
  }

  // The rows of x in calls of `chunk` rows each, concatenated.
  std::vector<float> gpu_matmul_chunked(MatrixId w, const std::vector<float>& x, int R, int64_t K, int64_t N,
                                        int chunk) {
    std::vector<float> out;
    for (int r0 = 0; r0 < R; r0 += chunk) {
      const int n = std::min(chunk, R - r0);
      const std::vector<float> o = gpu_matmul(w, rows_of(x, K, r0, n), n, K, N, {}, Accum::kOverwrite);
      out.insert(out.end(), o.begin(), o.end());
    }
    return out;
  }

  std::mt19937 rng_{4321};
};

std::vector<FormatCase> every_format() {
  std::vector<FormatCase> cases = {{WeightFormat::kF32}, {WeightFormat::kF16}, {WeightFormat::kBF16}};
  for (int bits : {2, 3, 4, 5, 6, 7, 8}) cases.push_back({WeightFormat::kAffine, bits, 32});
  cases.push_back({WeightFormat::kAffine, 4, 64, DType::kF16});
  cases.push_back({WeightFormat::kAffine, 6, 128, DType::kF32});
  cases.push_back({WeightFormat::kAffine, 8, 64});
  return cases;
}

std::vector<double> double_product(const std::vector<float>& x, const test::OwnedMatrix& w, int R, int64_t K,
                                   int64_t N, const std::vector<float>& init) {
  std::vector<double> ref(static_cast<size_t>(R * N));
  for (int r = 0; r < R; ++r) {
    for (int64_t n = 0; n < N; ++n) {
      double s = init.empty() ? 0.0 : init[static_cast<size_t>(r * N + n)];
      for (int64_t k = 0; k < K; ++k) {
        s += static_cast<double>(x[static_cast<size_t>(r * K + k)]) *
             w.reference[static_cast<size_t>(n * K + k)];
      }
      ref[static_cast<size_t>(r * N + n)] = s;
    }
  }
  return ref;
}

// Every format, tiles cut short in every direction: rows not a multiple of 64 (1, 37, 130), weight rows
// not a multiple of 64 or 128 (37, 200; bf16 also 1100, whose tiles are 256 rows wide),
// columns ending inside a 32-column stage (dense 40 and 264) or spanning many (2048); overwrite and add.
TEST_F(CudaPrefill, MatmulEveryFormatMatchesCpuAndDoubleReference) {
  double worst = 0;
  for (const FormatCase& f : every_format()) {
    const std::vector<int64_t> ks = f.format == WeightFormat::kAffine
                                        ? std::vector<int64_t>{f.group * 3L, 2048}
                                        : std::vector<int64_t>{40, 264, 2048};
    for (int64_t K : ks) {
      std::vector<int64_t> ns = {37, 200};
      if (f.format == WeightFormat::kBF16) ns.push_back(1100);
      for (int64_t N : ns) {
        SCOPED_TRACE(fmt::format("{} K={} N={}", describe(f), K, N));
        auto w = test::make_matrix(rng_, N, K, f.format, f.bits, f.group, 0.5f, f.scale_dtype);
        const MatrixId wc = cpu_->bind_matrix(w->m).value(), wg = gpu_->bind_matrix(w->m).value();
        for (int R : {1, 37, 130}) {
          if (cudatest::quick() && R == 130) continue;
          const std::vector<float> x = test::random_vector(rng_, static_cast<size_t>(R * K));
          const std::vector<float> init = test::random_vector(rng_, static_cast<size_t>(R * N));
          for (Accum acc : {Accum::kOverwrite, Accum::kAdd}) {
            const std::vector<float> got = gpu_matmul(wg, x, R, K, N, init, acc);
            Buffer xc = device_tensor(*cpu_, DType::kF32, R, K, x);
            Buffer oc = device_tensor(*cpu_, DType::kF32, R, N, init);
            ASSERT_TRUE(cpu_->matmul({.w = wc, .x = xc.tensor(), .out = oc.tensor(), .accum = acc}).is_ok());
            const double e_cpu = rel_err(got, download<float>(*cpu_, oc.tensor()));
            const double e_ref = test::rel_err(
                got, double_product(x, *w, R, K, N, acc == Accum::kAdd ? init : std::vector<float>{}));
            EXPECT_LE(e_cpu, kMmaTolerance) << "R=" << R << " vs CPU";
            EXPECT_LE(e_ref, kMmaTolerance) << "R=" << R << " vs double reference";
            worst = std::max({worst, e_cpu, e_ref});
          }
        }
      }
    }
  }
  std::printf("tensor-core products: largest relative error %.3g (tolerance %.3g)\n", worst, kMmaTolerance);
}

// Activations that are not 16-byte aligned (a column slice) take the 4-byte copy path: the same bits.
TEST_F(CudaPrefill, MatmulUnalignedActivationsGiveTheSameBits) {
  const int R = 70;
  const int64_t K = 256, N = 96;
  auto w = test::make_matrix(rng_, N, K, WeightFormat::kAffine, 4, 64);
  const MatrixId wg = gpu_->bind_matrix(w->m).value();
  const std::vector<float> x = test::random_vector(rng_, static_cast<size_t>(R * K));
  std::vector<float> padded(static_cast<size_t>(R * (K + 4)), 0.0f);
  for (int r = 0; r < R; ++r) {
    std::copy_n(x.begin() + r * K, K, padded.begin() + r * (K + 4) + 1);
  }
  Buffer xp = device_tensor(*gpu_, DType::kF32, R, K + 4, padded);
  Buffer og = device_tensor(*gpu_, DType::kF32, R, N, std::vector<float>{});
  ASSERT_TRUE(
      gpu_->matmul({.w = wg, .x = xp.tensor().col_slice(1, K), .out = og.tensor(), .prefill = true}).is_ok());
  EXPECT_TRUE(
      same_bits(download<float>(*gpu_, og.tensor()), gpu_matmul(wg, x, R, K, N, {}, Accum::kOverwrite)));
}

// A row's result does not depend on how many rows share the call or where the row sits in its tile: 256
// rows at once, in calls of 37 and of 1 row, bitwise; and two runs of the same call are identical.
TEST_F(CudaPrefill, MatmulIsDeterministicAndChunkInvariant) {
  const int R = cudatest::quick() ? 80 : 256;
  const int64_t K = 512, N = 300;
  for (const FormatCase& f :
       {FormatCase{WeightFormat::kBF16}, FormatCase{WeightFormat::kF32},
        FormatCase{WeightFormat::kAffine, 4, 64}, FormatCase{WeightFormat::kAffine, 6, 32}}) {
    SCOPED_TRACE(describe(f));
    auto w = test::make_matrix(rng_, N, K, f.format, f.bits, f.group);
    const MatrixId wg = gpu_->bind_matrix(w->m).value();
    const std::vector<float> x = test::random_vector(rng_, static_cast<size_t>(R * K));
    const std::vector<float> all = gpu_matmul(wg, x, R, K, N, {}, Accum::kOverwrite);
    EXPECT_TRUE(same_bits(gpu_matmul(wg, x, R, K, N, {}, Accum::kOverwrite), all)) << "second run";
    for (int chunk : {37, 1}) {
      const std::vector<float> parts = gpu_matmul_chunked(wg, x, R, K, N, chunk);
      for (int r = 0; r < R; ++r) {
        ASSERT_TRUE(same_bits(rows_of(parts, N, r, 1), rows_of(all, N, r, 1)))
            << "row " << r << " in calls of " << chunk << " rows";
      }
    }
  }
}

// matmuls of a prefill step (one launch for matrices of one format, else one per matrix) gives bitwise what
// matmul gives per target.
TEST_F(CudaPrefill, MatmulsEqualMatmulPerTarget) {
  const std::vector<std::vector<FormatCase>> groups = {
      {{WeightFormat::kBF16}, {WeightFormat::kBF16}, {WeightFormat::kBF16}, {WeightFormat::kBF16}},
      {{WeightFormat::kAffine, 6, 64}, {WeightFormat::kAffine, 6, 64}},
      {{WeightFormat::kF32}, {WeightFormat::kF16}, {WeightFormat::kAffine, 8, 32}}};
  const std::vector<int64_t> widths = {300, 5, 1, 64};
  const int64_t K = 256;
  for (const std::vector<FormatCase>& g : groups) {
    std::vector<std::unique_ptr<test::OwnedMatrix>> ws;
    std::vector<MatrixId> ids;
    for (size_t i = 0; i < g.size(); ++i) {
      ws.push_back(test::make_matrix(rng_, widths[i], K, g[i].format, g[i].bits, g[i].group));
      ids.push_back(gpu_->bind_matrix(ws.back()->m).value());
    }
    for (const int R : {1, 37, 200}) {
      SCOPED_TRACE(fmt::format("{} R={} matrices={}", describe(g[0]), R, g.size()));
      const std::vector<float> x = test::random_vector(rng_, static_cast<size_t>(R * K));
      Buffer xg = device_tensor(*gpu_, DType::kF32, R, K, x);
      std::vector<Buffer> fused;
      std::vector<MatmulTarget> targets;
      for (size_t i = 0; i < g.size(); ++i) {
        fused.push_back(device_tensor(*gpu_, DType::kF32, R, widths[i], std::vector<float>{}));
        targets.push_back({ids[i], fused.back().tensor()});
      }
      ASSERT_TRUE(gpu_->matmuls({.x = xg.tensor(), .targets = targets, .prefill = true}).is_ok());
      for (size_t i = 0; i < g.size(); ++i) {
        EXPECT_TRUE(same_bits(download<float>(*gpu_, fused[i].tensor()),
                              gpu_matmul(ids[i], x, R, K, widths[i], {}, Accum::kOverwrite)))
            << "target " << i;
      }
    }
  }
}

// Hopper builds (sm_90a) run the bf16 and (unless PD_AFFINE_TMA=0) the 2/4/6/8-bit affine products of matmul
// and matmuls on wgmma (gemm_tma.cu, gemm_tma_affine.cu); the mma.sync kernel agrees to rounding, and both
// with a double product: one to four parts, activation rows and weight rows cutting the tiles short, columns
// ending inside a 64-column stage, every affine group size and scale dtype, overwrite and add. Two runs give
// the same bits.
TEST_F(CudaPrefill, TmaProductsAgreeWithMmaSync) {
  if (!cuda::mma_tma_available()) {
    GTEST_SKIP() << "PD_MMA_TMA=0, or not an sm_90a build on a compute capability 9.0 device";
  }
  const std::vector<int64_t> widths = {1100, 37, 1, 300};
  auto device_copy = [](const void* host, size_t bytes) {
    void* d = nullptr;
    EXPECT_EQ(cudaMalloc(&d, bytes), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
  };
  std::vector<void*> owned;
  auto device_matrix = [&](const test::OwnedMatrix& w) {
    cuda::DevMatrix m;
    m.rows = w.m.rows;
    m.cols = w.m.cols;
    m.data = device_copy(w.data.data(), w.data.size());
    owned.push_back(const_cast<void*>(m.data));
    if (w.m.format == WeightFormat::kBF16) {
      m.fmt = cuda::WFmt::kBF16;
      return m;
    }
    m.fmt = cuda::WFmt::kAffine;
    m.bits = w.m.bits;
    m.group_size = w.m.group_size;
    m.scale_dtype = w.m.scale_dtype == DType::kF32   ? cuda::SDType::kF32
                    : w.m.scale_dtype == DType::kF16 ? cuda::SDType::kF16
                                                     : cuda::SDType::kBF16;
    m.scales = device_copy(w.scales.data(), w.scales.size());
    m.biases = device_copy(w.biases.data(), w.biases.size());
    owned.push_back(const_cast<void*>(m.scales));
    owned.push_back(const_cast<void*>(m.biases));
    return m;
  };
  struct Case {
    FormatCase f;
    std::vector<int64_t> ks;
  };
  // Affine columns: a 32-column group ending a stage early (96), 64- and 128-column groups over odd stage
  // counts (320, 384).
  const std::vector<Case> cases = {{{WeightFormat::kBF16}, {40, 264, 2048}},
                                   {{WeightFormat::kAffine, 8, 64}, {192, 2048}},
                                   {{WeightFormat::kAffine, 6, 64}, {320, 2048}},
                                   {{WeightFormat::kAffine, 4, 32, DType::kF16}, {96, 2048}},
                                   {{WeightFormat::kAffine, 2, 128, DType::kF32}, {384, 2048}}};
  for (const Case& c : cases) {
    if (c.f.format == WeightFormat::kAffine && !cuda::env_switch_on("PD_AFFINE_TMA")) {
      std::printf("%s: the wgmma affine products are off (PD_AFFINE_TMA=0)\n", describe(c.f).c_str());
      continue;
    }
    for (const int64_t K : c.ks) {
      std::vector<std::unique_ptr<test::OwnedMatrix>> ws;
      std::vector<cuda::DevMatrix> dm;
      for (const int64_t n : widths) {
        ws.push_back(test::make_matrix(rng_, n, K, c.f.format, c.f.bits, c.f.group, 0.5f, c.f.scale_dtype));
        dm.push_back(device_matrix(*ws.back()));
      }
      for (const int parts : {1, 4}) {
        for (const int R : {1, 130, 300}) {
          if (cudatest::quick() && R == 300) continue;
          for (const bool add : {false, true}) {
            SCOPED_TRACE(fmt::format("{} K={} parts={} R={} add={}", describe(c.f), K, parts, R, add));
            const std::vector<float> x = test::random_vector(rng_, static_cast<size_t>(R * K));
            void* xd = device_copy(x.data(), x.size() * 4);
            owned.push_back(xd);
            std::vector<std::vector<float>> init(static_cast<size_t>(parts));
            std::vector<void*> out_tma, out_mma;
            cuda::MmaJob j;
            j.parts = parts;
            j.accumulate = add;
            j.tile_cols = cuda::mma_tile_cols(dm[0], nullptr);
            for (int i = 0; i < parts; ++i) {
              init[i] = test::random_vector(rng_, static_cast<size_t>(R * widths[i]));
              out_tma.push_back(device_copy(init[i].data(), init[i].size() * 4));
              out_mma.push_back(device_copy(init[i].data(), init[i].size() * 4));
              owned.push_back(out_tma.back());
              owned.push_back(out_mma.back());
              cuda::MmaPart& p = j.part[i];
              p.w = dm[i];
              p.x = static_cast<const float*>(xd);
              p.xs = K;
              p.rows = R;
              p.os = widths[i];
              p.n_tiles_end = (i == 0 ? 0 : j.part[i - 1].n_tiles_end) +
                              static_cast<int>((widths[i] + j.tile_cols - 1) / j.tile_cols);
            }
            ASSERT_TRUE(cuda::mma_tma_takes(j));
            const int tiles = (R + cuda::kMmaRows - 1) / cuda::kMmaRows;
            void* scratch = nullptr;
            ASSERT_EQ(cudaMalloc(&scratch, static_cast<size_t>(cuda::mma_tma_scratch_bytes(j, tiles))),
                      cudaSuccess);
            owned.push_back(scratch);
            auto run = [&](const std::vector<void*>& outs, bool tma) {
              for (int i = 0; i < parts; ++i) j.part[i].out = static_cast<float*>(outs[i]);
              if (tma) {
                cuda::launch_mma_tma(j, tiles, scratch, nullptr);
              } else {
                cuda::launch_mma(j, tiles, nullptr);
              }
              EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            };
            auto fetch = [&](const std::vector<void*>& outs) {
              std::vector<std::vector<float>> v;
              for (int i = 0; i < parts; ++i) {
                v.emplace_back(init[i].size());
                EXPECT_EQ(cudaMemcpy(v[i].data(), outs[i], v[i].size() * 4, cudaMemcpyDeviceToHost),
                          cudaSuccess);
              }
              return v;
            };
            run(out_tma, true);
            run(out_mma, false);
            const std::vector<std::vector<float>> tma = fetch(out_tma), mma = fetch(out_mma);
            for (int i = 0; i < parts; ++i) {
              EXPECT_LE(rel_err(tma[i], mma[i]), kMmaTolerance) << "part " << i << " vs mma.sync";
              EXPECT_LE(test::rel_err(tma[i], double_product(x, *ws[i], R, K, widths[i],
                                                             add ? init[i] : std::vector<float>{})),
                        kMmaTolerance)
                  << "part " << i << " vs double reference";
            }
            if (!add) {  // a second run overwrites with the same bits
              run(out_tma, true);
              const std::vector<std::vector<float>> again = fetch(out_tma);
              for (int i = 0; i < parts; ++i)
                EXPECT_TRUE(same_bits(again[i], tma[i])) << "part " << i << " rerun";
            }
          }
        }
      }
    }
  }
  for (void* p : owned) cudaFree(p);
}

// The tiled CUDA-core kernels the tensor cores replaced stay available as a reference
// (set_cuda_reference_prefill): both agree within the tensor cores' tolerance.
TEST_F(CudaPrefill, ReferencePathAgrees) {
  const int R = 70;
  const int64_t K = 512, N = 200;
  auto w = test::make_matrix(rng_, N, K, WeightFormat::kAffine, 8, 64);
  const MatrixId wg = gpu_->bind_matrix(w->m).value();
  const std::vector<float> x = test::random_vector(rng_, static_cast<size_t>(R * K));
  const std::vector<float> mma = gpu_matmul(wg, x, R, K, N, {}, Accum::kOverwrite);
  set_cuda_reference_prefill(*gpu_, true);
  const std::vector<float> tiled = gpu_matmul(wg, x, R, K, N, {}, Accum::kOverwrite);
  set_cuda_reference_prefill(*gpu_, false);
  EXPECT_LE(rel_err(mma, tiled), kMmaTolerance);
  EXPECT_LE(test::rel_err(tiled, double_product(x, *w, R, K, N, {})), 1e-5) << "tiled reference vs double";
}

// The device counting sort equals the host reference: random routings, and the extremes (every row picks
// experts 0..K-1, so the others get no row and expert 0 gets every row; a single row).
TEST_F(CudaPrefill, MoePartitionMatchesHostReference) {
  const int E = 64, K = 8;
  struct Routing {
    const char* what;
    int rows;
    bool skewed;
  };
  for (const Routing& c : {Routing{"random", 300, false}, Routing{"random", 1, false},
                           Routing{"skewed", 130, true}, Routing{"random", 4096, false}}) {
    SCOPED_TRACE(fmt::format("{} rows={}", c.what, c.rows));
    const int R = c.rows;
    std::vector<int> sel(static_cast<size_t>(R * K));
    std::vector<int> ids(static_cast<size_t>(E));
    for (int r = 0; r < R; ++r) {
      std::iota(ids.begin(), ids.end(), 0);
      if (!c.skewed) std::shuffle(ids.begin(), ids.end(), rng_);
      std::sort(ids.begin(), ids.begin() + K);
      std::copy_n(ids.begin(), K, sel.begin() + r * K);
    }
    const cuda::MoePartition want = cuda::moe_partition_reference(sel, R, K, E, cuda::kMmaRows);
    Buffer sel_g = device_tensor(*gpu_, DType::kI32, R, K, sel);
    Buffer list = gpu_->alloc(DType::kI32, E, R).value(), count = gpu_->alloc(DType::kI32, 1, E).value();
    Buffer starts = gpu_->alloc(DType::kI32, 1, E + 1).value();
    cuda::launch_moe_partition(static_cast<const int*>(sel_g.tensor().data), R, K, E,
                               static_cast<int*>(list.tensor().data), static_cast<int*>(count.tensor().data),
                               static_cast<int*>(starts.tensor().data), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<int> got_count = download<int>(*gpu_, count.tensor());
    const std::vector<int> got_list = download<int>(*gpu_, list.tensor());
    EXPECT_EQ(got_count, want.count);
    EXPECT_EQ(download<int>(*gpu_, starts.tensor()), want.tile_start);
    for (int e = 0; e < E; ++e) {
      const size_t at = static_cast<size_t>(e) * static_cast<size_t>(R);
      const size_t n = static_cast<size_t>(want.count[static_cast<size_t>(e)]);
      EXPECT_TRUE(std::equal(want.list.begin() + at, want.list.begin() + at + n, got_list.begin() + at))
          << "entries of expert " << e;
    }
    if (c.skewed) {
      EXPECT_EQ(want.count[0], R);
      EXPECT_EQ(want.count[K], 0);
    }
  }
}

// Router weights that send every row to expert 0 and never to experts 1..E/2 (rows carry a large first
// column): experts with no row and an expert with every row.
void force_routing(MoeFixture& f, int experts, int64_t hidden, std::mt19937& rng) {
  auto* w = reinterpret_cast<uint16_t*>(f.owned[0]->data.data());
  std::uniform_real_distribution<float> small(-0.01f, 0.01f), mid(-0.1f, 0.1f);
  for (int e = 0; e < experts; ++e) {
    for (int64_t k = 0; k < hidden; ++k) {
      float v = small(rng);
      if (k == 0) v = e == 0 ? 1.0f : (e <= experts / 2 ? -1.0f : mid(rng));
      w[e * hidden + k] = f32_to_bf16(v);
    }
  }
}

struct MoeCase {
  int experts, top_k;
  int64_t hidden, inter, shared_inter;
  FormatCase g, u, dn;
  bool shared_own_format = false;  // the shared expert in bf16 (its own launches)
  bool forced = false;             // force_routing
};

TEST_F(CudaPrefill, GroupedMoeMatchesCpuAndIsChunkInvariant) {
  const std::vector<MoeCase> cases = {
      {8, 2, 64, 32, 0, {WeightFormat::kF32}, {WeightFormat::kF32}, {WeightFormat::kF32}},
      {8,
       2,
       64,
       32,
       0,
       {WeightFormat::kAffine, 6, 32},
       {WeightFormat::kAffine, 4, 32},
       {WeightFormat::kAffine, 8, 32}},
      {16,
       4,
       128,
       64,
       96,
       {WeightFormat::kAffine, 8, 64},
       {WeightFormat::kAffine, 8, 64},
       {WeightFormat::kAffine, 8, 64},
       true,
       true},
      // One affine width throughout, the shared expert too: the wgmma affine products on Hopper (gate/up
      // pairs of grouped and plain parts; 32-column groups with a down product ending a stage early).
      {16,
       4,
       256,
       128,
       192,
       {WeightFormat::kAffine, 6, 64},
       {WeightFormat::kAffine, 6, 64},
       {WeightFormat::kAffine, 6, 64}},
      {8,
       2,
       128,
       96,
       64,
       {WeightFormat::kAffine, 4, 32, DType::kF16},
       {WeightFormat::kAffine, 4, 32, DType::kF16},
       {WeightFormat::kAffine, 4, 32, DType::kF16}},
      {64, 8, 256, 128, 0, {WeightFormat::kBF16}, {WeightFormat::kBF16}, {WeightFormat::kBF16}, false, true},
      {64, 8, 256, 128, 0, {WeightFormat::kBF16}, {WeightFormat::kBF16}, {WeightFormat::kBF16}},
      // gate/up pairs of 1024 rows and a down product of 1024: the wide tiles.
      {8, 2, 1024, 512, 512, {WeightFormat::kBF16}, {WeightFormat::kBF16}, {WeightFormat::kBF16}}};
  for (const MoeCase& c : cases) {
    if (cudatest::small() && &c != &cases.front()) break;
    SCOPED_TRACE(fmt::format("E={} k={} {}{}{}", c.experts, c.top_k, describe(c.g),
                             c.shared_own_format ? ", shared bf16" : "", c.forced ? ", forced routing" : ""));
    MoeFixture f = make_moe(rng_, c.experts, c.hidden, c.inter, c.g, c.u, c.dn, c.shared_inter,
                            {WeightFormat::kBF16}, c.shared_own_format);
    if (c.forced) force_routing(f, c.experts, c.hidden, rng_);
    const MoeSpec spec{.num_experts_per_tok = c.top_k, .norm_topk_prob = true};
    const MoeId mc = cpu_->bind_moe(f.w, spec).value(), mg = gpu_->bind_moe(f.w, spec).value();
    const int R = cudatest::small() ? 70 : 150;
    std::vector<float> x = test::random_vector(rng_, static_cast<size_t>(R * c.hidden));
    if (c.forced) {
      for (int r = 0; r < R; ++r) x[static_cast<size_t>(r * c.hidden)] = 8.0f;
    }
    auto run = [&](Backend& be, MoeId id, int r0, int n, Accum acc, const std::vector<float>& init) {
      Buffer xb = device_tensor(be, DType::kF32, n, c.hidden, rows_of(x, c.hidden, r0, n));
      Buffer ob = device_tensor(be, DType::kF32, n, c.hidden, init);
      const Status s =
          be.moe({.moe = id, .x = xb.tensor(), .out = ob.tensor(), .accum = acc, .prefill = true});
      EXPECT_TRUE(s.is_ok()) << s.to_string();
      return download<float>(be, ob.tensor());
    };
    const std::vector<float> init = test::random_vector(rng_, static_cast<size_t>(R * c.hidden));
    for (Accum acc : {Accum::kOverwrite, Accum::kAdd}) {
      const std::vector<float> want = run(*cpu_, mc, 0, R, acc, init);
      const std::vector<float> got = run(*gpu_, mg, 0, R, acc, init);
      EXPECT_LE(rel_err(got, want), 1e-4) << "vs CPU, accum " << static_cast<int>(acc);
      EXPECT_TRUE(same_bits(run(*gpu_, mg, 0, R, acc, init), got)) << "second run";
    }
    const std::vector<float> all = run(*gpu_, mg, 0, R, Accum::kOverwrite, {});
    for (int chunk : {37, 1}) {
      for (int r0 = 0; r0 < R; r0 += chunk) {
        const int n = std::min(chunk, R - r0);
        const std::vector<float> part = run(*gpu_, mg, r0, n, Accum::kOverwrite, {});
        ASSERT_TRUE(same_bits(part, rows_of(all, c.hidden, r0, n)))
            << "rows " << r0 << ".." << r0 + n - 1 << " in calls of " << chunk;
      }
    }
  }
}

// A recorded prefill step (one CUDA graph: products, the grouped MoE with its sort, a bf16 product added into
// the output) gives the bits of eager execution, also when replayed.
TEST_F(CudaPrefill, RecordedStepMatchesEager) {
  const int R = 100;
  const int64_t H = 128;
  MoeFixture f =
      make_moe(rng_, 16, H, 64, {WeightFormat::kBF16}, {WeightFormat::kBF16}, {WeightFormat::kBF16});
  const MoeId mg = gpu_->bind_moe(f.w, {.num_experts_per_tok = 4, .norm_topk_prob = true}).value();
  auto w = test::make_matrix(rng_, H, H, WeightFormat::kAffine, 6, 64);
  const MatrixId wg = gpu_->bind_matrix(w->m).value();
  auto wb = test::make_matrix(rng_, H, H, WeightFormat::kBF16);  // gemm_tma.cu on Hopper builds
  const MatrixId wbg = gpu_->bind_matrix(wb->m).value();
  Buffer x = gpu_->alloc(DType::kF32, R, H).value(), y = gpu_->alloc(DType::kF32, R, H).value();
  Buffer out = gpu_->alloc(DType::kF32, R, H).value();
  auto step = [&](const std::vector<float>& host, bool record) {
    if (record) {
      EXPECT_TRUE(gpu_->begin_step().is_ok());
    }
    EXPECT_TRUE(gpu_->upload(x.tensor(), host.data()).is_ok());
    EXPECT_TRUE(gpu_->matmul({.w = wg, .x = x.tensor(), .out = y.tensor(), .prefill = true}).is_ok());
    EXPECT_TRUE(gpu_->moe({.moe = mg, .x = y.tensor(), .out = out.tensor(), .prefill = true}).is_ok());
    EXPECT_TRUE(
        gpu_->matmul({.w = wbg, .x = y.tensor(), .out = out.tensor(), .accum = Accum::kAdd, .prefill = true})
            .is_ok());
    if (record) {
      EXPECT_TRUE(gpu_->end_step().is_ok());
    }
    return download<float>(*gpu_, out.tensor());
  };
  for (int i = 0; i < 3; ++i) {
    const std::vector<float> host = test::random_vector(rng_, static_cast<size_t>(R * H));
    const std::vector<float> eager = step(host, false);
    EXPECT_TRUE(same_bits(step(host, true), eager)) << "recorded step " << i;
  }
}

}  // namespace
}  // namespace pd
