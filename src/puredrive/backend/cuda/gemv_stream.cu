// Matrix-vector products of bf16 weights for decode and verify steps (1..kMaxRows rows), streamed through
// shared memory by the bulk copy engine.
//
// Why: gemv_mma.cu keeps the weights in flight with register loads, a few per lane, and each warp waits for
// its loads before it issues the next ones. The decode step's matrices are small (17-50 MB): such a kernel
// spends much of its time ramping up and down, and the 16 MB products reached 1.3 TB/s. Here one producer
// warp per SM keeps kStages chunks of 16 weight rows (about 200 KB) in flight with cp.async.bulk, from the
// start of the kernel (weights do not depend on the previous kernel, so it need not wait for it), and 16
// consumer warps multiply what has arrived.
//
// The product: the tensor-core scheme of gemv_mma.cu (weights as the A operand of mma m16n8k16, the step's
// rows as B, activations split into bf16 hi + lo). Consumer warp w owns columns [w * slice, (w + 1) * slice)
// of every chunk, and keeps the hi/lo fragments of its columns of all 8 rows in registers for the whole
// kernel. Per tile, each warp's 16 x 8 partial goes to shared memory and the 16 partials of an output are
// summed in warp order.
//
// Row-exact: an output depends only on its weight row and its activation row (mma_bf16); the order of its
// sum (chunks, the warp's columns, then the warps in order) is fixed by the matrix width. Unused rows are
// zero columns of B; rows past a matrix's end repeat its last row and are not stored.
#include <cstdlib>

#include "puredrive/backend/cuda/common.cuh"
#include "puredrive/backend/cuda/gemv_mma.h"

namespace pd::cuda {
namespace {

constexpr int kConsumers = 16;                   // consumer warps
constexpr int kThreads = (kConsumers + 1) * 32;  // and one producer warp
constexpr int kStages = 6;                       // chunks in flight per SM
constexpr int kRowPad = 64;  // staged rows g and g + 1 fall in opposite halves of the banks

// K = 512 * KB columns, streamed in chunks of at most 1024 columns (16 rows x 2 KB per stage).
template <int KB>
struct Shape {
  static constexpr int kCols = 512 * KB;
  static constexpr int kChunk = kCols < 1024 ? kCols : 1024;
  static constexpr int kChunks = kCols / kChunk;
  static constexpr int kSlice = kChunk / kConsumers;  // columns per consumer warp and chunk: 32 or 64
  static constexpr int kBlocks32 = kSlice / 32;
  static constexpr int kRowBytes = kChunk * 2 + kRowPad;
  static constexpr int kStageBytes = kTileN * kRowBytes;
  static constexpr int kCopyBytes = kTileN * kChunk * 2;
  static constexpr int kSmemBytes = kStages * kStageBytes + 2 * kConsumers * 32 * 16 + 2 * kStages * 8;
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (done == 0) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, "
        "p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  }
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
// Synchronises the consumer warps only (the producer never joins).
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumers * 32) : "memory");
}

// The matrix of tile `tile` (i, advanced from its previous value) and the tile's first row.
__device__ __forceinline__ int64_t tile_rows(const MmaTargets& t, int64_t tile, int* i) {
  while (tile >= t.tile_end[*i]) ++*i;
  return (tile - (*i == 0 ? 0 : t.tile_end[*i - 1])) * kTileN;
}

template <int KB, bool VEC>
__global__ void __launch_bounds__(kThreads, 1)
    gemv_stream_kernel(const __grid_constant__ MmaTargets t, const float* x, int64_t xs, int rows) {
  using S = Shape<KB>;
  extern __shared__ __align__(128) uint8_t smem[];
  float4* part = reinterpret_cast<float4*>(smem + kStages * S::kStageBytes);  // [2][kConsumers][32]
  uint64_t* full = reinterpret_cast<uint64_t*>(part + 2 * kConsumers * 32);
  uint64_t* empty = full + kStages;
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int64_t tiles = t.tile_end[t.count - 1];
  const int64_t tile_begin = blockIdx.x * tiles / gridDim.x, tile_stop = (blockIdx.x + 1) * tiles / gridDim.x;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  pdl_launch_dependents();

  if (warp == kConsumers) {
    // Producer: the weights are constant, so it streams them without waiting for the previous kernel.
    const int64_t fills = (tile_stop - tile_begin) * S::kChunks;
    int i = 0;
    for (int64_t f = 0; f < fills; ++f) {
      const int s = static_cast<int>(f % kStages);
      if (f >= kStages) mbar_wait(&empty[s], static_cast<uint32_t>((f / kStages - 1) & 1));
      const int64_t n0 = tile_rows(t, tile_begin + f / S::kChunks, &i);
      const DevMatrix& m = t.m[i];
      if (lane == 0) mbar_expect(&full[s], S::kCopyBytes);
      __syncwarp();
      if (lane < kTileN) {
        const int64_t n = n0 + lane < m.rows ? n0 + lane : m.rows - 1;
        const uint16_t* src =
            static_cast<const uint16_t*>(m.data) + n * S::kCols + (f % S::kChunks) * S::kChunk;
        bulk_copy(smem + s * S::kStageBytes + lane * S::kRowBytes, src, S::kChunk * 2, &full[s]);
      }
    }
    return;
  }

  // Consumers: the activations' hi/lo fragments of this warp's columns, lane (g, q) holding row g.
  pdl_wait();
  const int g = lane >> 2, q = lane & 3;
  const bool has_row = g < rows;
  const float* xr = x + (has_row ? g : 0) * xs;
  uint32_t frag[S::kChunks][S::kBlocks32][8];
#pragma unroll
  for (int c = 0; c < S::kChunks; ++c) {
#pragma unroll
    for (int h = 0; h < S::kBlocks32; ++h) {
      float v[8] = {};
      if (has_row) load_x8<VEC>(xr + c * S::kChunk + warp * S::kSlice + 32 * h + 8 * q, v);
      uint32_t* fr = frag[c][h];
      split_pair(v[0], v[1], &fr[0], &fr[2]);
      split_pair(v[2], v[3], &fr[1], &fr[3]);
      split_pair(v[4], v[5], &fr[4], &fr[6]);
      split_pair(v[6], v[7], &fr[5], &fr[7]);
    }
  }
  const int col_bytes = (warp * S::kSlice + 8 * q) * 2;
  int64_t f = 0;
  int buf = 0, i = 0;
  for (int64_t tile = tile_begin; tile < tile_stop; ++tile) {
    float acc[4] = {};
#pragma unroll
    for (int c = 0; c < S::kChunks; ++c, ++f) {
      const int s = static_cast<int>(f % kStages);
      mbar_wait(&full[s], static_cast<uint32_t>((f / kStages) & 1));
      const uint8_t* st = smem + s * S::kStageBytes + col_bytes;
#pragma unroll
      for (int h = 0; h < S::kBlocks32; ++h) {
        const uint4 wg = *reinterpret_cast<const uint4*>(st + g * S::kRowBytes + 64 * h);
        const uint4 w8 = *reinterpret_cast<const uint4*>(st + (g + 8) * S::kRowBytes + 64 * h);
        const uint32_t* fr = frag[c][h];
        const uint32_t a0[4] = {wg.x, w8.x, wg.y, w8.y}, a1[4] = {wg.z, w8.z, wg.w, w8.w};
        mma_bf16(acc, a0, fr[0], fr[1]);
        mma_bf16(acc, a0, fr[2], fr[3]);
        mma_bf16(acc, a1, fr[4], fr[5]);
        mma_bf16(acc, a1, fr[6], fr[7]);
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
    }
    float4* p = part + buf * kConsumers * 32;
    p[warp * 32 + lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    consumers_sync();
    const int64_t n0 = tile_rows(t, tile, &i);
    if (threadIdx.x < kTileN * 8) {
      // Output (weight row n0 + off, step row r): element e of lane (off % 8, r / 2) of every warp.
      const int off = static_cast<int>(threadIdx.x >> 3), r = static_cast<int>(threadIdx.x & 7);
      const int src = (off & 7) * 4 + (r >> 1), e = (off >= 8 ? 2 : 0) + (r & 1);
      const float* pf = reinterpret_cast<const float*>(p);
      float sum = pf[src * 4 + e];
#pragma unroll
      for (int w = 1; w < kConsumers; ++w) sum += pf[(w * 32 + src) * 4 + e];
      const DevMatrix& m = t.m[i];
      if (r < rows && n0 + off < m.rows) {
        float* o = t.out[i] + r * t.os[i] + n0 + off;
        *o = t.accumulate != 0 ? *o + sum : sum;
      }
    }
    buf ^= 1;
  }
}

template <int KB, bool VEC>
void launch_shape(const MmaTargets& t, const float* x, int64_t xs, int rows, cudaStream_t stream) {
  constexpr int kSmem = Shape<KB>::kSmemBytes;
  static const int sms = [] {
    int dev = 0, n = 132;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    cudaFuncSetAttribute(gemv_stream_kernel<KB, VEC>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    return n;
  }();
  const int64_t tiles = t.tile_end[t.count - 1];
  const unsigned grid = static_cast<unsigned>(tiles < sms ? tiles : sms);
  launch_pdl(gemv_stream_kernel<KB, VEC>, dim3(grid), dim3(kThreads), kSmem, stream, t, x, xs, rows);
}

template <bool VEC>
void launch_vec(const MmaTargets& t, const float* x, int64_t xs, int rows, cudaStream_t stream) {
  switch (t.m[0].cols) {
    case 512:
      launch_shape<1, VEC>(t, x, xs, rows, stream);
      return;
    case 1024:
      launch_shape<2, VEC>(t, x, xs, rows, stream);
      return;
    case 2048:
      launch_shape<4, VEC>(t, x, xs, rows, stream);
      return;
    default:
      launch_shape<8, VEC>(t, x, xs, rows, stream);
      return;
  }
}

}  // namespace

bool gemv_stream_supported(const DevMatrix& m) {
  static const bool enabled = [] {
    const char* v = std::getenv("PD_GEMV_STREAM");
    return v == nullptr || v[0] != '0';
  }();
  const int64_t k = m.cols;
  return enabled && m.fmt == WFmt::kBF16 && (k == 512 || k == 1024 || k == 2048 || k == 4096) && m.rows > 0 &&
         reinterpret_cast<uintptr_t>(m.data) % 16 == 0;
}

void launch_gemv_stream(const MmaTargets& t, const float* x, int64_t xs, int rows, cudaStream_t stream) {
  if (reinterpret_cast<uintptr_t>(x) % 16 == 0 && xs % 4 == 0) {
    launch_vec<true>(t, x, xs, rows, stream);
  } else {
    launch_vec<false>(t, x, xs, rows, stream);
  }
}

}  // namespace pd::cuda
