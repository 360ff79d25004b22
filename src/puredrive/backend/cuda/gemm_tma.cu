// Tensor-core products for prefill on Hopper's wgmma, fed by the tensor memory accelerator (kernels.h,
// "Tensor-core products for prefill"): the bf16 matrices that the matmul and matmuls ops multiply, in blocks
// of kRows activation rows x kCols weight rows. A split kernel first writes the activations as bf16 hi and lo
// arrays (split_pair, the split gemm_mma.cu makes per stage); then one producer thread copies stages of kK
// columns of hi, lo and the weights into 128-byte-swizzled shared tiles (cp.async.bulk.tensor, one mbarrier
// per stage) and two consumer warpgroups, 64 rows each, issue m64n256k16 products from those tiles,
// releasing each stage once its products are done.
//
// Determinism: an output element is hi*w then lo*w for each k16 step in ascending order, accumulated in one
// register; it depends only on its activation row and weight row (rows and columns past the matrices are
// zeros from the copy engine), not on R or the row's place in its tile (docs/DESIGN.md §4.6).

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdio>
#include <cstdlib>

#include "puredrive/backend/cuda/common.cuh"

namespace pd::cuda {
namespace {

constexpr int kRows = 128;  // activation rows per block (two consumer warpgroups of 64)
constexpr int kCols = 256;  // weight rows per block: the instruction's N
constexpr int kK = 64;      // columns per stage: one 128-byte swizzle row of bf16
constexpr int kStages = 3;
constexpr int kThreads = 384;  // warpgroup 0 copies, 1 and 2 multiply
constexpr uint32_t kATile = kRows * kK * 2;
constexpr uint32_t kBTile = kCols * kK * 2;
constexpr uint32_t kStageBytes = 2 * kATile + kBTile;                     // hi, lo, weights
constexpr size_t kSmem = kStages * kStageBytes + 2 * kStages * 8 + 1024;  // tiles, barriers, alignment

struct TmaJob {                 // 64-byte aligned, as CUtensorMap is
  CUtensorMap hi, lo;           // activations [rows, K] bf16
  CUtensorMap w[kMmaMaxParts];  // each part's weights [N, K] bf16
  float* out[kMmaMaxParts];
  int64_t os[kMmaMaxParts];
  int64_t n[kMmaMaxParts];        // weight rows
  int n_tiles_end[kMmaMaxParts];  // cumulative kCols tiles
  int parts;
  int rows;
  int k_tiles;
  bool accumulate;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// A shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format") for a K-major tile whose 128-byte
// rows the copy engine swizzled: 8-row groups 1024 bytes apart; the start address moves 32 bytes per k16.
__device__ __forceinline__ uint64_t tile_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3ffff) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]),
        "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]),
        "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]),
        "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]),
        "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]),
        "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]),
        "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),
        "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b), "r"(1));
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads of the accumulators above a wait.
__device__ __forceinline__ void fence_registers(float (&d)[128]) {
#pragma unroll
  for (int i = 0; i < 128; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, int k, int row, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], "
      "[%2];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(k), "r"(row)
      : "memory");
}
#endif

__global__ void __launch_bounds__(kThreads, 1) tma_mma_kernel(const __grid_constant__ TmaJob j) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* const smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);  // swizzle atoms: 1024
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* const empty = full + kStages;
  int p = 0;
  while (p + 1 < j.parts && static_cast<int>(blockIdx.y) >= j.n_tiles_end[p]) ++p;
  const int nt = static_cast<int>(blockIdx.y) - (p == 0 ? 0 : j.n_tiles_end[p - 1]);
  const int m0 = static_cast<int>(blockIdx.x) * kRows;
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 8);  // one arrival per consumer warp
    }
    mbar_init_fence();
  }
  __syncthreads();
  pdl_wait();  // the split activations

  if (tid < 128) {
    if (tid == 0) {
      for (int kt = 0; kt < j.k_tiles; ++kt) {
        const int s = kt % kStages;
        if (kt >= kStages) mbar_wait(&empty[s], static_cast<uint32_t>((kt / kStages - 1) & 1));
        uint8_t* const stage = smem + s * kStageBytes;
        mbar_expect(&full[s], kStageBytes);
        tma_load(stage, &j.hi, kt * kK, m0, &full[s]);
        tma_load(stage + kATile, &j.lo, kt * kK, m0, &full[s]);
        tma_load(stage + 2 * kATile, &j.w[p], kt * kK, nt * kCols, &full[s]);
      }
    }
    pdl_launch_dependents();
    return;
  }

  const int wg = tid / 128 - 1;  // consumer warpgroup: activation rows 64 wg .. 64 wg + 63 of the tile
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
  for (int kt = 0; kt < j.k_tiles; ++kt) {
    const int s = kt % kStages;
    mbar_wait(&full[s], static_cast<uint32_t>((kt / kStages) & 1));
    const uint32_t stage = smem_addr(smem + s * kStageBytes);
    const uint32_t a_hi = stage + wg * (kATile / 2), a_lo = a_hi + kATile, b = stage + 2 * kATile;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kK / 16; ++kk) {
      wgmma_m64n256k16(acc, tile_desc(a_hi + 32 * kk), tile_desc(b + 32 * kk));
      wgmma_m64n256k16(acc, tile_desc(a_lo + 32 * kk), tile_desc(b + 32 * kk));
    }
    wgmma_commit();
    // Waiting for the stage before this one instead (wait_group 1) makes ptxas serialise the products
    // (C7515); the other warpgroup's products fill the gap.
    wgmma_wait<0>();
    if ((tid & 31) == 0) mbar_arrive(&empty[s]);
  }
  fence_registers(acc);
  pdl_launch_dependents();

  // Accumulator 4 i + e of a thread (warp w of its warpgroup, lane = 4 g + t): row 16 w + g (+ 8 for e >= 2),
  // column 8 i + 2 t (+ 1 for odd e), as in mma.sync's fragments.
  const int lane = tid & 31, warp = (tid >> 5) & 3;
  const int g = lane >> 2, t4 = lane & 3;
  const int64_t N = j.n[p];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = m0 + wg * 64 + warp * 16 + g + half * 8;
    if (row >= j.rows) continue;
    float* o = j.out[p] + static_cast<int64_t>(row) * j.os[p];
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int64_t n = static_cast<int64_t>(nt) * kCols + 8 * i + 2 * t4;
      const float c0 = acc[4 * i + 2 * half], c1 = acc[4 * i + 2 * half + 1];
      if (n < N) o[n] = j.accumulate ? o[n] + c0 : c0;
      if (n + 1 < N) o[n + 1] = j.accumulate ? o[n + 1] + c1 : c1;
    }
  }
#endif
}

// x [rows, K] (row stride xs) into bf16 hi and lo arrays [rows, K]: four columns per thread.
__global__ void split_rows_kernel(const float* x, int64_t xs, int rows, int64_t K, uint16_t* hi,
                                  uint16_t* lo) {
  pdl_enter();
  const int64_t quads = K / 4;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * quads) return;
  const int64_t r = i / quads, k = (i % quads) * 4;
  const float* s = x + r * xs + k;
  uint2 h, l;
  split_pair(s[0], s[1], &h.x, &l.x);
  split_pair(s[2], s[3], &h.y, &l.y);
  *reinterpret_cast<uint2*>(hi + r * K + k) = h;
  *reinterpret_cast<uint2*>(lo + r * K + k) = l;
}

using EncodeTiled = PFN_cuTensorMapEncodeTiled_v12000;

EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

// A bf16 matrix [rows, cols] (rows of cols elements, contiguous) read in boxes of box_rows x kK, swizzled.
bool tile_map(CUtensorMap* map, const void* data, int64_t rows, int64_t cols, int box_rows) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
  const cuuint32_t box[2] = {kK, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t steps[2] = {1, 1};
  return encode_tiled()(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(data), dims, strides, box,
                        steps, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

bool device_has_wgmma() {
#if defined(PD_CUDA_SM90A)
  static const bool ok = [] {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return major == 9 && minor == 0 && encode_tiled() != nullptr &&
           cudaFuncSetAttribute(tma_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(kSmem)) == cudaSuccess;
  }();
  return ok;
#else
  return false;
#endif
}

}  // namespace

bool mma_tma_available() {
  static const bool on = env_switch_set("PD_MMA_TMA");
  return on && device_has_wgmma();
}

bool mma_tma_takes(const MmaJob& j) {
  if (j.dual || j.parts <= 0 || !mma_tma_available()) return false;
  const MmaPart& first = j.part[0];
  for (int i = 0; i < j.parts; ++i) {
    const MmaPart& p = j.part[i];
    if (p.grouped || p.w.fmt != WFmt::kBF16 || p.w.cols != first.w.cols || p.x != first.x ||
        p.xs != first.xs || p.rows != first.rows || reinterpret_cast<uintptr_t>(p.w.data) % 16 != 0 ||
        p.w.cols % 8 != 0) {
      return false;
    }
  }
  return true;
}

int64_t mma_tma_scratch_bytes(const MmaJob& j) {
  return int64_t{4} * j.part[0].rows * j.part[0].w.cols;
}

void launch_mma_tma(const MmaJob& j, void* scratch, cudaStream_t stream) {
  const MmaPart& first = j.part[0];
  const int rows = first.rows;
  const int64_t K = first.w.cols;
  if (rows <= 0) return;
  auto* hi = static_cast<uint16_t*>(scratch);
  uint16_t* lo = hi + static_cast<int64_t>(rows) * K;
  TmaJob t{};
  bool ok = tile_map(&t.hi, hi, rows, K, kRows) && tile_map(&t.lo, lo, rows, K, kRows);
  int tiles = 0;
  for (int i = 0; i < j.parts; ++i) {
    const MmaPart& p = j.part[i];
    ok = ok && tile_map(&t.w[i], p.w.data, p.w.rows, K, kCols);
    t.out[i] = p.out;
    t.os[i] = p.os;
    t.n[i] = p.w.rows;
    tiles += static_cast<int>((p.w.rows + kCols - 1) / kCols);
    t.n_tiles_end[i] = tiles;
  }
  if (!ok) {  // mma_tma_takes vouched for the shapes: only a failing driver gets here
    std::fprintf(stderr, "puredrive: cuTensorMapEncodeTiled failed\n");
    std::abort();
  }
  t.parts = j.parts;
  t.rows = rows;
  t.k_tiles = static_cast<int>((K + kK - 1) / kK);
  t.accumulate = j.accumulate;
  const int64_t quads = static_cast<int64_t>(rows) * (K / 4);
  launch_pdl(split_rows_kernel, dim3(static_cast<unsigned>((quads + 255) / 256)), dim3(256), 0, stream,
             first.x, first.xs, rows, K, hi, lo);
  launch_pdl(tma_mma_kernel,
             dim3(static_cast<unsigned>((rows + kRows - 1) / kRows), static_cast<unsigned>(tiles)),
             dim3(kThreads), kSmem, stream, t);
}

}  // namespace pd::cuda
