// The tensor-core and asynchronous-copy primitives (sm_80+, PTX inline): the bf16 mma and the hi + lo split
// of f32 operands, cp.async copies global -> shared, ldmatrix.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace pd::cuda {

// d = a . b + d on the tensor cores: mma.sync m16n8k16, bf16 inputs, f32 accumulation. Fragments (PTX ISA
// "Matrix Fragments for mma.m16n8k16", g = lane / 4, t = lane % 4): a0 = A[g][2t, 2t+1], a1 = A[g+8][2t,
// 2t+1], a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9]; b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]; d0, d1 =
// D[g][2t, 2t+1], d2, d3 = D[g+8][2t, 2t+1] (lower column in the low half of a register). An output element
// depends only on its row of A and its column of B, so the other rows or columns sharing the instruction
// (other verify rows, padding) never change it.
__device__ __forceinline__ void mma_bf16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_bf16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  mma_bf16(d, a, b[0], b[1]);
}

// (a, b) as bf16 pairs hi (round to nearest) and lo = the rounded remainders (x - hi is exact in f32), a in
// the low half: hi + lo holds about 16 significant bits of each.
__device__ __forceinline__ void split_pair(float a, float b, uint32_t* hi, uint32_t* lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  const __nv_bfloat162 l = __floats2bfloat162_rn(a - __low2float(h), b - __high2float(h));
  *hi = *reinterpret_cast<const uint32_t*>(&h);
  *lo = *reinterpret_cast<const uint32_t*>(&l);
}

// 16 bytes global -> shared without registers (cp.async, sm_80+); both addresses 16-byte aligned. The copies
// of a thread complete at copy_async_wait_all(); a block barrier after it publishes them to the block.
__device__ __forceinline__ void copy16_async(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
// 4 bytes likewise (4-byte aligned addresses).
__device__ __forceinline__ void copy4_async(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void copy_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}
// N (4, 8 or 16) bytes global -> shared, or N zero bytes without reading when !valid (gmem must still be a
// mapped address); both addresses N-byte aligned. Completed per commit group (copy_async_commit,
// copy_async_wait).
template <int N>
__device__ __forceinline__ void copy_or_zero_async(void* smem, const void* gmem, bool valid) {
  static_assert(N == 4 || N == 8 || N == 16, "cp.async copies 4, 8 or 16 bytes");
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (N == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(s), "l"(gmem), "n"(N),
                 "r"(valid ? N : 0)
                 : "memory");
  }
}
__device__ __forceinline__ void copy_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N of this thread's committed copy groups are still in flight.
template <int N>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ldmatrix.x4 loads four 8 x 8 bf16 matrices whose rows (16 bytes each) lanes 8i..8i+7 address, matrix i into
// register i: lane (g, t) receives row g, columns 2t, 2t+1; with .trans, rows 2t, 2t+1 of column g.
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* p) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* p) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s)
               : "memory");
}

}  // namespace pd::cuda
