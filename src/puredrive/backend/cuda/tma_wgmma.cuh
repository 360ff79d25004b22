// The Hopper primitives of the TMA-fed wgmma products (gemm_tma.cu): shared-memory matrix descriptors for
// 128-byte-swizzled K-major tiles, wgmma m64n256k16 / m64n128k16 (bf16 in, f32 accumulate, both operands
// from shared memory), and 2D tensor copies completing on an mbarrier. Device code exists only in sm_90a
// builds (__CUDA_ARCH_FEAT_SM90_ALL).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "puredrive/backend/cuda/common.cuh"
#include "puredrive/backend/cuda/moe_partition.h"

namespace pd::cuda {
// Host side (gemm_tma.cu). Whether this build and device run the kernels of this header (an sm_90a build on
// an sm_90 device, with the driver's tensor-map encoder).
bool wgmma_available();
// A tensor map of `rank` dimensions (dims innermost first; strides in bytes of dimensions 1..), zeros past
// its ends. Only where wgmma_available(); false when the driver refuses it.
bool encode_tensor_map(CUtensorMap* map, CUtensorMapDataType type, uint32_t rank, const void* data,
                       const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                       CUtensorMapSwizzle swizzle);
// A bf16 matrix [rows, cols], rows row_stride elements apart, read in 128-byte-swizzled boxes of box_rows x
// box_cols (box_cols x 2 bytes at most 128), zeros past its ends (encode_tensor_map).
bool encode_bf16_tile_map(CUtensorMap* map, const void* data, int64_t rows, int64_t cols, int64_t row_stride,
                          int box_cols, int box_rows);
// The copy engine refused a tensor map whose shapes the caller had checked: only a failing driver gets here.
[[noreturn]] void tensor_map_failed();
}  // namespace pd::cuda

namespace pd::cuda::tma {

// Row `row` of a grouped part's gathered activations (tile_rows rows a tile): row tile t = row / tile_rows
// holds its expert's entries i = (t - tile_start[e]) * tile_rows + row % tile_rows in order, each the
// activation row list[...] / list_div of x. False past the last tile; *src null past the expert's entries.
__device__ __forceinline__ bool gathered_source(const float* x, int64_t xs, const int* list,
                                                int64_t list_stride, const int* count, const int* tile_start,
                                                int experts, int list_div, int row, int tile_rows,
                                                const float** src) {
  const int t = row / tile_rows;
  if (t >= tile_start[experts]) return false;
  const int e = expert_of_tile(tile_start, experts, t);
  const int i = (t - tile_start[e]) * tile_rows + row % tile_rows;
  *src = i < count[e]
             ? x + static_cast<int64_t>(list[static_cast<int64_t>(e) * list_stride + i] / list_div) * xs
             : nullptr;
  return true;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// A shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format") for a K-major tile whose 128-byte
// rows the copy engine swizzled: 8-row groups 1024 bytes apart; the start address moves 32 bytes per k16.
__device__ __forceinline__ uint64_t tile_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3ffff) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

// The accumulator operands of the wgmma statements below: "+f"(d[i]) for each register of the fragment.
#define PD_WGMMA_ACC8(d, i)                                                                   \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define PD_WGMMA_ACC32(d, i) \
  PD_WGMMA_ACC8(d, i), PD_WGMMA_ACC8(d, i + 8), PD_WGMMA_ACC8(d, i + 16), PD_WGMMA_ACC8(d, i + 24)
#define PD_WGMMA_ACC64(d) PD_WGMMA_ACC32(d, 0), PD_WGMMA_ACC32(d, 32)
#define PD_WGMMA_ACC128(d) PD_WGMMA_ACC64(d), PD_WGMMA_ACC32(d, 64), PD_WGMMA_ACC32(d, 96)

// ... and their places in the statements' text: "%0, %1, ..." for the fragment's registers.
#define PD_WGMMA_REGS32                                                                                  \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define PD_WGMMA_REGS64                                                                     \
  PD_WGMMA_REGS32                                                                           \
  ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, " \
  "%49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define PD_WGMMA_REGS128                                                                     \
  PD_WGMMA_REGS64                                                                            \
  ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, "  \
  "%81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, "    \
  "%98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, " \
  "%113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" PD_WGMMA_REGS128
      "}, "
      "%128, %129, p, 1, 1, 0, 0;\n"
      "}\n"
      : PD_WGMMA_ACC128(d)
      : "l"(a), "l"(b), "r"(1));
}

__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" PD_WGMMA_REGS64
      "}, "
      "%64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : PD_WGMMA_ACC64(d)
      : "l"(a), "l"(b), "r"(1));
}

// S = A B (scale_d 0) or S += A B: both operands K-major 128-byte-swizzled shared tiles (tile_desc).
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], uint64_t a, uint64_t b, int scale_d) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" PD_WGMMA_REGS32
      "}, "
      "%32, %33, p, 1, 1, 0, 0;\n"
      "}\n"
      : PD_WGMMA_ACC32(d, 0)
      : "l"(a), "l"(b), "r"(scale_d));
}

// S = A B (scale_d 0) or S += A B with A from registers (the m16n8k16 A fragment of each warp's 16 rows: four
// bf16x2 registers) and B a K-major 128-byte-swizzled shared tile (tile_desc). The registers are read while
// the product runs: none may be written before the wgmma_wait that covers it.
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b,
                                                   int scale_d) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" PD_WGMMA_REGS32
      "}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n"
      "}\n"
      : PD_WGMMA_ACC32(d, 0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}

// D += A B with A from registers (the m16n8k16 A fragment of each warp's 16 rows: four bf16x2 registers)
// and B an N-major shared operand (nmajor_desc).
__device__ __forceinline__ void wgmma_m64n256k16_rs_nmajor(float (&d)[128], const uint32_t (&a)[4],
                                                           uint64_t b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" PD_WGMMA_REGS128
      "}, "
      "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n"
      "}\n"
      : PD_WGMMA_ACC128(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

// An N-major B operand (imm-trans-b 1) in 128-byte-swizzled tiles as the copy engine writes a [K][N] matrix
// in boxes of 64 N-columns: each K row's 64 values one 128-byte row, 8-row groups 1024 bytes apart (the
// stride along K), boxes `n_block_bytes` apart (the leading offset, along N); the start address moves 2048
// bytes per k16.
__device__ __forceinline__ uint64_t nmajor_desc(uint32_t addr, uint32_t n_block_bytes) {
  return static_cast<uint64_t>((addr & 0x3ffff) >> 4) |
         (static_cast<uint64_t>((n_block_bytes >> 4) & 0x3fff) << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

// Orders this thread's generic-proxy shared-memory writes before later async-proxy reads (wgmma operands).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
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
template <int N>
__device__ __forceinline__ void fence_registers(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// mbar_wait that gives up after about two seconds with a trap: while this kernel is new, a copy that never
// lands (a bad tensor map) fails the launch instead of hanging the device.
__device__ __forceinline__ void wait_stage(uint64_t* bar, uint32_t parity) {
  const long long t0 = clock64();
  while (!mbar_test(bar, parity)) {
    if (clock64() - t0 > (1ll << 32)) __trap();
  }
}

// The ring's start in dynamic shared memory: swizzled tiles need 1024-byte alignment (a kernel's dynamic
// shared memory keeps 1024 bytes for it).
__device__ __forceinline__ uint8_t* ring_base(uint8_t* smem_raw) {
  return smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
}

// The producer's turn at stage kt: waits until the consumers gave the slot back (from the second round on)
// and expects `bytes` on its full barrier; returns the slot.
__device__ __forceinline__ int acquire_stage(uint64_t* full, uint64_t* empty, int kt, int stages,
                                             uint32_t bytes) {
  const int s = kt % stages;
  if (kt >= stages) wait_stage(&empty[s], static_cast<uint32_t>((kt / stages - 1) & 1));
  mbar_expect(&full[s], bytes);
  return s;
}

// The part of weight-row tile `tile` (the parts' tiles counted in turn) and its tile within the part.
__device__ __forceinline__ void block_part(int tile, const int* n_tiles_end, int parts, int* p, int* nt) {
  int q = 0;
  while (q + 1 < parts && tile >= n_tiles_end[q]) ++q;
  *p = q;
  *nt = tile - (q == 0 ? 0 : n_tiles_end[q - 1]);
}

// Thread 0 sets up the ring's barriers: a full barrier per stage (the producer's arrival with the copies'
// bytes), an empty one (one arrival per consumer warp). The block barrier that follows publishes them.
__device__ __forceinline__ void init_stages(uint64_t* full, uint64_t* empty, int stages) {
  if (threadIdx.x != 0) return;
  for (int s = 0; s < stages; ++s) {
    mbar_init(&full[s], 1);
    mbar_init(&empty[s], 8);
  }
  mbar_init_fence();
}

// Row tile t of a part's activations (tile_rows rows a tile): a grouped part's tile of its expert's entries
// (moe_partition.h), else rows t * tile_rows .. of a plain part of `rows` rows.
struct RowTile {
  int expert = 0, first = 0, count = 0;
};
// False when the tile has no rows (the block has nothing to do).
__device__ __forceinline__ bool row_tile(bool grouped, int t, int tile_rows, int rows, const int* tile_start,
                                         const int* count, int experts, RowTile* r) {
  if (grouped) {
    if (t >= tile_start[experts]) return false;
    r->expert = expert_of_tile(tile_start, experts, t);
    r->first = (t - tile_start[r->expert]) * tile_rows;
    r->count = min(tile_rows, count[r->expert] - r->first);
  } else {
    r->first = t * tile_rows;
    if (r->first >= rows) return false;
    r->count = min(tile_rows, rows - r->first);
  }
  return true;
}
// The output row of the tile's row i (a grouped part's list entry), or -1 past its rows.
__device__ __forceinline__ int row_tile_dst(const RowTile& r, bool grouped, const int* list,
                                            int64_t list_stride, int i) {
  if (i >= r.count) return -1;
  return grouped ? list[static_cast<int64_t>(r.expert) * list_stride + r.first + i] : r.first + i;
}

// The box at (column k, row) of a 2D map (tile_map), completing on bar.
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, int k, int row, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], "
      "[%2];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(k), "r"(row)
      : "memory");
}
// The box at (column k, row, expert e) of a 3D map (tile_map_experts).
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, int k, int row, int e,
                                         uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(k), "r"(row), "r"(e)
      : "memory");
}
#endif

}  // namespace pd::cuda::tma
