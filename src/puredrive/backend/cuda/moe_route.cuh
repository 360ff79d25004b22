// Routing of a MoE chunk (spec §6), shared by moe.cu's router kernel and moe_stream_up.cu's fused router: one
// warp per row from the router logits, then the ascending list of the experts any row selected.
#pragma once

#include "puredrive/backend/cuda/common.cuh"

namespace pd::cuda {

// Routes one row with one warp (spec §6): fp32 softmax over the E <= 32 EPL logits, top-k by (probability
// desc, id asc), weights renormalised in selection order when norm, written to sel/wts sorted by expert id
// (the order in which the combine sums). Lane l holds experts l + 32 j in registers; every reduction is
// lane-strided in j order then an xor butterfly, so the result depends only on the row.
template <int EPL>
__device__ void route_row_regs(const float* logits, int E, int K, bool norm, int* sel, float* wts) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  float p[EPL];
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < EPL; ++j) {
    const int e = lane + 32 * j;
    p[j] = e < E ? __ldcg(logits + e) : -INFINITY;  // L2: other blocks may have written them
    mx = fmaxf(mx, p[j]);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < EPL; ++j) {
    if (lane + 32 * j < E) {
      p[j] = expf(p[j] - mx);
      sum = sum + p[j];
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum = sum + __shfl_xor_sync(0xffffffffu, sum, off);
#pragma unroll
  for (int j = 0; j < EPL; ++j) p[j] = lane + 32 * j < E ? p[j] / sum : -1.0f;
  // Round i's winner is kept by lane i. The lane's winners so far are bits of `taken`, not overwritten
  // probabilities, so p stays in registers (overwritten in the loop, it went to local memory).
  int my_id = E;
  float my_p = 0.0f;
  uint32_t taken = 0;
  for (int i = 0; i < K; ++i) {
    float bv = -1.0f;
    int bj = 0;
#pragma unroll
    for (int j = 0; j < EPL; ++j) {
      const float pj = (taken >> j) & 1u ? -1.0f : p[j];
      if (pj > bv) {  // ascending j: the lowest id wins a tie within the lane
        bv = pj;
        bj = j;
      }
    }
    // The warp's (probability desc, id asc) winner in two warp reductions instead of a five-round
    // butterfly of (value, id) pairs: bv is -1 or a non-negative float (never NaN: a NaN never wins the
    // scan), so its bits order as signed ints; then the lowest id among the lanes holding that value.
    const int top_bits = __reduce_max_sync(0xffffffffu, __float_as_int(bv));
    const int bi =
        __reduce_min_sync(0xffffffffu, __float_as_int(bv) == top_bits && bv >= 0.0f ? lane + 32 * bj : E);
    bv = __int_as_float(top_bits);
    if (bi < E && (bi & 31) == lane) taken |= 1u << (bi >> 5);
    if (lane == i) {
      my_id = bi;
      my_p = bv;
    }
  }
  float top = 0.0f;  // in selection order
  for (int i = 0; i < K; ++i) top += __shfl_sync(0xffffffffu, my_p, i);
  // Lane i < K writes its expert at its rank by id.
  int rank = 0;
  for (int i = 0; i < K; ++i) rank += __shfl_sync(0xffffffffu, my_id, i) < my_id ? 1 : 0;
  if (lane < K) {
    sel[rank] = my_id;
    wts[rank] = norm ? my_p / top : my_p;
  }
}

// Routes row `logits` with the calling warp (E <= 1024). Out of line: moe_stream_up.cu runs the same code
// early to bring it into the instruction cache.
static __device__ __noinline__ void route_row(const float* logits, int E, int K, bool norm, int* sel,
                                              float* wts) {
  if (E <= 256) {
    route_row_regs<8>(logits, E, K, norm, sel, wts);
  } else if (E <= 512) {
    route_row_regs<16>(logits, E, K, norm, sel, wts);
  } else {
    route_row_regs<32>(logits, E, K, norm, sel, wts);
  }
}

// Router output n of a chunk's rows, computed by the calling warp: logits[r * E + n] for n < E, sg[r] (the
// shared-expert gate) for n == E. One warp per output as gemv: a row's value depends on that row only.
template <int FMT, int BITS, bool VEC, int NR>
__device__ __forceinline__ void router_output(const MoeLaunch& m, int64_t n, const float* x, int64_t xs,
                                              int rows, int lane, float* logits, float* sg) {
  const int E = m.experts;
  const DevMatrix& w = n < E ? m.router : m.shared_gate;
  const float* xr[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) xr[r] = x + r * xs;
  float acc[NR] = {};
  dot_rows<FMT, BITS, VEC, NR>(w, w.data, w.scales, w.biases, n < E ? n : 0, xr, (1u << rows) - 1u, lane,
                               acc);
  warp_sum_rows<NR>(acc, rows);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if (r < rows) {
        if (n < E) {
          logits[r * E + n] = acc[r];
        } else {
          sg[r] = acc[r];
        }
      }
    }
  }
}

constexpr int kMaxExpertWords = 32;  // experts <= 1024

// The ascending list of the experts in sel [n] (n = rows x top_k): used[i] and *count, by a popcount scan
// over a bitmask. Called by every thread of a group of `threads` (>= 32, a multiple of 32) that sync with
// sync(); bits and before: kMaxExpertWords each, shared. Every thread of the group may read the list after.
template <typename Sync>
__device__ __forceinline__ void list_used_experts(const int* sel, int n, int E, int threads, uint32_t* bits,
                                                  int* before, int* used, int* count, Sync sync) {
  const int t0 = static_cast<int>(threadIdx.x), lane = t0 & 31;
  if (t0 < kMaxExpertWords) bits[t0] = 0;
  sync();
  for (int t = t0; t < n; t += threads) {
    const int e = sel[t];
    atomicOr(&bits[e >> 5], 1u << (e & 31));
  }
  sync();
  if (t0 < 32) {
    const int c = __popc(bits[lane]);
    int incl = c;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += y;
    }
    before[lane] = incl - c;
    if (lane == 31) *count = incl;
  }
  sync();
  // Expert e's place: the used experts in the words before, then the bits below it.
  for (int e = t0; e < E; e += threads) {
    const uint32_t word = bits[e >> 5], bit = 1u << (e & 31);
    if (word & bit) used[before[e >> 5] + __popc(word & (bit - 1u))] = e;
  }
  sync();  // the list is complete for every thread of the group
}

}  // namespace pd::cuda
