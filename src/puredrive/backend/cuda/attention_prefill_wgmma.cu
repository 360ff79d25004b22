// Causal flash attention for prefill steps on Hopper's wgmma (sm_90a builds, head dim 256, bf16 cache; the
// default where it applies, PD_ATTN_WGMMA=0: the mma.sync kernel). The mma.sync kernel (attention_prefill.cu)
// reads every K and V tile through ldmatrix once per warp, about 2.25 shared-memory wavefronts per
// tensor-core cycle of its products; wgmma reads a shared operand once per warpgroup of four warps.
//
// Block = (query head, query tile): the step's rows whose positions fall in one 64-aligned block of absolute
// positions, as in attention_prefill.cu. A producer warpgroup (one thread) copies the K and V tiles of keys
// [64 t, 64 t + 64) (t ascending) with the tensor memory accelerator into a two-stage ring of
// 128-byte-swizzled boxes of 64 keys x 64 dims; the consumer warpgroup (16 rows per warp) computes S = Q K^T
// (wgmma m64n64k16, Q and K from shared memory), the online-softmax update of each row (max, exp2, sum in a
// fixed order, as attention_prefill.cu), and O += P V (wgmma m64n256k16, P from registers rounded to bf16, V
// an N-major operand), then out = (O / l) * sigmoid(gate). The heads of a KV head run side by side and share
// its tiles in L2.
//
// Chunking invariance (docs/DESIGN.md §4.6) holds as in attention_prefill.cu: a row's result depends on its
// position and the cache alone (its query tile holds the same rows in every cut at multiples of 64, key tiles
// are fixed by absolute position, the sums per row run in a fixed order). Its bits differ from the mma.sync
// kernel's (the tensor cores' summation order per instruction differs), within the tolerances of the tests.
#include <cuda.h>

#include <cstdio>
#include <cstdlib>

#include "puredrive/backend/cuda/attention_mma.cuh"
#include "puredrive/backend/cuda/tma_wgmma.cuh"

namespace pd::cuda {
namespace {

constexpr int kD = 256;
constexpr int kRows = 64;  // rows per consumer warpgroup: one 64-aligned block of positions
constexpr int kKeys = kAttnTile;
// One consumer warpgroup per block: it holds O (128 registers per thread) and S (32), 218 registers in all
// (ptxas -v). Two consumer warpgroups and setmaxnreg (240 each, 24 for the producer) still spill 256 bytes:
// ptxas allocated their code at most 220 registers and spilled S around the products.
constexpr int kHeads = 1;
constexpr int kThreads = 128 * (kHeads + 1);  // and a producer warpgroup (one thread copies)
constexpr int kStages = 2;
constexpr int kProducerBarrier = kHeads + 1;     // named barriers: 0 the block's, 1 .. kHeads the consumers'
constexpr uint32_t kBox = 64 * 128;              // 64 rows x 64 bf16, swizzled
constexpr uint32_t kTileBytes = kD / 64 * kBox;  // Q of a head, or K or V of a tile: 32 KB
constexpr uint32_t kStageBytes = 2 * kTileBytes;
constexpr size_t kSmem = kHeads * kTileBytes + kStages * kStageBytes + (2 * kStages + 1) * 8 + 1024;
static_assert(kKeys == 64 && kRows == kAttnTile, "tiles share the 64-position alignment");

struct WgmmaAttnJob {
  CUtensorMap k, v;  // the caches [capacity, Hkv * D] in boxes of 64 keys x 64 dims
  AttentionLaunch a;
  const float* qbuf;
};

__global__ void __launch_bounds__(kThreads, 1)
    attn_prefill_wgmma_kernel(const __grid_constant__ WgmmaAttnJob j) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace tma;
  pdl_enter();
  extern __shared__ uint8_t smem_raw[];
  uint8_t* const smem = ring_base(smem_raw);
  uint8_t* const ring = smem + kHeads * kTileBytes;
  uint64_t* const full = reinterpret_cast<uint64_t*>(ring + kStages * kStageBytes);
  uint64_t* const empty = full + kStages;
  uint64_t* const zeroed = empty + kStages;  // the last tile's stale value rows are zeros
  __shared__ int spos[kRows];
  const AttentionLaunch& a = j.a;
  const int h0 = static_cast<int>(blockIdx.x) * kHeads, qt = static_cast<int>(blockIdx.y);
  const int kh = h0 / (a.num_heads / a.num_kv_heads);
  const attn::QueryTile tile = attn::query_tile(a, qt);
  if (tile.nr <= 0) return;  // uniform over the block
  const int rb = tile.rb, nr = tile.nr;
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 4 * kHeads);
    }
    mbar_init(zeroed, 128);
    mbar_init_fence();
  }
  attn::tile_positions(a, tile, tid, spos);
  __syncthreads();
  int max_pos = -1;
  for (int r = 0; r < kRows; ++r) max_pos = spos[r] > max_pos ? spos[r] : max_pos;
  const int tiles = max_pos < 0 ? 0 : max_pos / kKeys + 1;
  // The last tile's values past the block's last position are not the step's (stale, or a NaN left by an
  // earlier request): zeros, so that a zero probability never meets a NaN. The producer warpgroup clears
  // them, keeping that code out of the consumers' registers.
  const int last_k0 = (tiles - 1) * kKeys;
  const bool stale_tail = tiles > 0 && max_pos + 1 < last_k0 + kKeys;

  if (tid >= 128 * kHeads) {  // the producer warpgroup
    const int pt = tid - 128 * kHeads;
    if (pt == 0) {
      int s = 0;
      for (int kt = 0; kt < tiles; ++kt) {
        s = acquire_stage(full, empty, kt, kStages, kStageBytes);
        uint8_t* const stage = ring + s * kStageBytes;
        for (int b = 0; b < kD / 64; ++b) {
          tma_load(stage + b * kBox, &j.k, kh * kD + 64 * b, kt * kKeys, &full[s]);
          tma_load(stage + kTileBytes + b * kBox, &j.v, kh * kD + 64 * b, kt * kKeys, &full[s]);
        }
      }
      // Parity waits hold only for a barrier's current phase: this thread, which just issued the last
      // tile into a slot the consumers gave back, is the one that knows it is.
      if (stale_tail) wait_stage(&full[s], static_cast<uint32_t>(((tiles - 1) / kStages) & 1));
    }
    if (stale_tail) {
      __syncwarp();  // bar.sync is .aligned: the copy thread's warp meets it converged
      asm volatile("bar.sync %0, 128;\n" ::"n"(kProducerBarrier) : "memory");  // the last tile landed
      uint8_t* const v_tile = ring + ((tiles - 1) % kStages) * kStageBytes + kTileBytes;
      for (int i = pt; i < (last_k0 + kKeys - max_pos - 1) * (kD / 8); i += 128) {
        const int r = max_pos + 1 - last_k0 + i / (kD / 8), c = i % (kD / 8);
        *reinterpret_cast<uint4*>(v_tile + (c / 8) * kBox + r * 128 + (c % 8) * 16) = make_uint4(0, 0, 0, 0);
      }
      fence_proxy_async();
      mbar_arrive(zeroed);
    }
    return;
  }

  const int wg = tid / 128, h = h0 + wg, t128 = tid % 128;
  const int warp = t128 >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  // The head's queries as bf16 into four swizzled boxes of 64 rows x 64 dims: 16-byte chunk c of row r at
  // chunk c ^ (r mod 8) of its 128-byte row, as the copy engine would have written them.
  uint8_t* const qs = smem + wg * kTileBytes;
  for (int i = t128; i < kRows * (kD / 8); i += 128) {
    const int r = i / (kD / 8), c = i % (kD / 8);
    uint4 packed = make_uint4(0, 0, 0, 0);
    if (r < nr) {
      const float4* src = reinterpret_cast<const float4*>(
          j.qbuf + (static_cast<int64_t>(rb + r) * a.num_heads + h) * kD + c * 8);
      const float4 x = src[0], y = src[1];
      packed = make_uint4(attn::pack_bf16(x.x, x.y), attn::pack_bf16(x.z, x.w), attn::pack_bf16(y.x, y.y),
                          attn::pack_bf16(y.z, y.w));
    }
    *reinterpret_cast<uint4*>(qs + (c / 8) * kBox + r * 128 + (((c % 8) ^ (r & 7)) * 16)) = packed;
  }
  fence_proxy_async();
  asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");  // the warpgroup's queries are in

  const int pos0 = spos[warp * 16 + g], pos1 = spos[warp * 16 + g + 8];
  const float sl2 = static_cast<float>(1.4426950408889634 / 16.0);  // log2(e) / sqrt(256)
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  const uint32_t q_addr = smem_addr(qs);
  for (int kt = 0; kt < tiles; ++kt) {
    const int s = kt % kStages, k0 = kt * kKeys;
    wait_stage(&full[s], static_cast<uint32_t>((kt / kStages) & 1));
    if (kt == tiles - 1 && stale_tail) wait_stage(zeroed, 0);
    uint8_t* const stage = ring + s * kStageBytes;
    const uint32_t k_addr = smem_addr(stage), v_addr = k_addr + kTileBytes;
    uint32_t qa = q_addr;
    asm volatile("" : "+r"(qa));  // the descriptors made per tile, not held across the loop in registers
    float sc[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) sc[i] = 0.0f;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t off = (kk / 4) * kBox + 32 * (kk % 4);
      wgmma_m64n64k16(sc, tile_desc(qa + off), tile_desc(k_addr + off), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(sc);
    // This lane's key block nb is sc[4 nb .. 4 nb + 3], as an m16n8 accumulator.
    auto score = [&](int nb, int e) -> float& { return sc[4 * nb + e]; };
    float al0, al1;
    attn::softmax_tile(score, k0, t, pos0, pos1, sl2, m0, m1, l0, l1, al0, al1);
#pragma unroll
    for (int n = 0; n < 32; ++n) {
      o[4 * n] = o[4 * n] * al0;
      o[4 * n + 1] = o[4 * n + 1] * al0;
      o[4 * n + 2] = o[4 * n + 2] * al1;
      o[4 * n + 3] = o[4 * n + 3] * al1;
    }
    uint32_t pa[4][4];
    attn::probability_fragments(score, pa);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma_m64n256k16_rs_nmajor(o, pa[kk], nmajor_desc(v_addr + 2048 * kk, kBox));
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(o);
    if (lane == 0) mbar_arrive(&empty[s]);
  }
  attn::write_gated_rows<kD>(a, h, rb, nr, warp, g, t, pos0, pos1, l0, l1,
                             [&](int n, int e) { return o[4 * n + e]; });
#endif
}

}  // namespace

bool attn_prefill_wgmma_takes(const AttentionLaunch& a) {
  static const bool ready =
      env_switch_on("PD_ATTN_WGMMA") && wgmma_available() &&
      cudaFuncSetAttribute(attn_prefill_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(kSmem)) == cudaSuccess;
  const int group = a.num_kv_heads > 0 ? a.num_heads / a.num_kv_heads : 0;
  return ready && a.cache_bf16 && a.head_dim == kD && group % kHeads == 0;
}

void launch_attn_prefill_wgmma(const AttentionLaunch& a, const float* qbuf, cudaStream_t stream) {
  WgmmaAttnJob j{};
  const int64_t kvw = int64_t{a.num_kv_heads} * kD;
  if (!encode_bf16_tile_map(&j.k, a.cache_k, a.capacity, kvw, kvw, 64, kKeys) ||
      !encode_bf16_tile_map(&j.v, a.cache_v, a.capacity, kvw, kvw, 64, kKeys)) {
    std::fprintf(stderr, "puredrive: cuTensorMapEncodeTiled failed for the attention caches\n");
    std::abort();
  }
  j.a = a;
  j.qbuf = qbuf;
  const dim3 grid(static_cast<unsigned>(a.num_heads / kHeads),
                  static_cast<unsigned>((a.rows + kRows - 1) / kRows + 1));
  launch_pdl(attn_prefill_wgmma_kernel, grid, dim3(kThreads), kSmem, stream, j);
}

}  // namespace pd::cuda
