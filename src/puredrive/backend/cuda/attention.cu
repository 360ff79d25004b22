// Gated full attention after the projections (backend.h GatedAttentionArgs; spec §4), in three kernels per
// chunk of up to kMaxRows rows:
// 1. per (row, head): RMSNorm of the query / key head, NeoX RoPE at the row's position; keys and values are
//    written to the cache at that position, queries to scratch;
// 2. split-K over the cache: block (split c, KV head, row) covers positions [c * kAttnSplit, ...) of
//    [0, position] for every query head of the group: scores, the split's max and sum of exponentials, and
//    the unnormalised sum of p * v;
// 3. per (row, query head): the splits merged in ascending order, normalised, times sigmoid(gate).
// Split points depend only on the row's position, and every reduction runs in a fixed order, so each row's
// result is independent of the other rows. Rows of a chunk see the keys written by earlier rows (phase 1
// completes before phase 2), and chunks run in order.
#include "puredrive/backend/cuda/common.cuh"

namespace pd::cuda {
namespace {

__global__ void qk_norm_rope_kernel(AttentionLaunch a, int r0, float* qbuf) {
  pdl_enter();
  extern __shared__ float xs[];  // [D]
  __shared__ float red[32];
  const int r = static_cast<int>(blockIdx.x);
  const int gr = r0 + r;
  const int hh = static_cast<int>(blockIdx.y);
  const int D = a.head_dim;
  const int32_t pos = a.positions[gr * a.position_stride];
  const bool is_q = hh < a.num_heads;
  if (!is_q && (pos < 0 || pos >= a.capacity)) return;  // uniform over the block
  const int kh = hh - a.num_heads;
  const float* src = is_q ? a.qg + gr * a.qg_stride + static_cast<int64_t>(hh) * 2 * D
                          : a.k + gr * a.k_stride + static_cast<int64_t>(kh) * D;
  const float* w = is_q ? a.q_norm : a.k_norm;
  float s = 0.0f;
  for (int d = threadIdx.x; d < D; d += blockDim.x) s = fmaf(src[d], src[d], s);
  const float total = block_sum(s, red);
  const float inv = 1.0f / sqrtf(total / static_cast<float>(D) + a.eps);
  for (int d = threadIdx.x; d < D; d += blockDim.x) xs[d] = (src[d] * inv) * w[d];
  __syncthreads();
  const int rot = a.rotary_dim, half = rot / 2;
  const int64_t kvw = static_cast<int64_t>(a.num_kv_heads) * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float y = xs[d];
    if (d < rot) {
      // HF: inv_freq_i = 1 / theta^(2i / rotary_dim) in f32, angle = position * inv_freq_i.
      const int i = d < half ? d : d - half;
      const float exponent = static_cast<float>(2 * i) / static_cast<float>(rot);
      const float inv_freq = 1.0f / powf(a.rope_theta, exponent);
      const float angle = static_cast<float>(pos) * inv_freq;
      const float c = cosf(angle), sn = sinf(angle);
      const float lo = xs[i], hi = xs[i + half];
      y = d < half ? lo * c - hi * sn : hi * c + lo * sn;
    }
    if (is_q) {
      qbuf[(static_cast<int64_t>(r) * a.num_heads + hh) * D + d] = y;
    } else {
      const int64_t at = static_cast<int64_t>(pos) * kvw + static_cast<int64_t>(kh) * D + d;
      const float vv = a.v[gr * a.v_stride + static_cast<int64_t>(kh) * D + d];
      if (a.cache_bf16) {
        static_cast<uint16_t*>(a.cache_k)[at] = to_bf16_bits(y);
        static_cast<uint16_t*>(a.cache_v)[at] = to_bf16_bits(vv);
      } else {
        static_cast<float*>(a.cache_k)[at] = y;
        static_cast<float*>(a.cache_v)[at] = vv;
      }
    }
  }
}

template <bool BF16>
__device__ __forceinline__ void load_kv8(const void* cache, int64_t at, float x[8]) {
  if constexpr (BF16) {
    const uint4 q = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(cache) + at);
    const uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x[2 * i] = bf16_bits(u[i] & 0xffffu);
      x[2 * i + 1] = bf16_bits(u[i] >> 16);
    }
  } else {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(cache) + at);
    const float4 u = p[0], v = p[1];
    x[0] = u.x, x[1] = u.y, x[2] = u.z, x[3] = u.w, x[4] = v.x, x[5] = v.y, x[6] = v.z, x[7] = v.w;
  }
}

template <bool BF16>
__device__ __forceinline__ float load_kv1(const void* cache, int64_t at) {
  if constexpr (BF16) {
    return bf16_bits(static_cast<const uint16_t*>(cache)[at]);
  } else {
    return static_cast<const float*>(cache)[at];
  }
}

// The split's maximum and sum of exp(score - max) per query head, one warp per head (lane-strided, then an
// xor butterfly); the scores are replaced by their exponentials. Score t of head g is at
// sc[t * t_stride + g * g_stride]; (max, sum) of head g go to ml[g * ml_head_stride + {0, 1}].
__device__ __forceinline__ void split_softmax(float* sc, int t_stride, int g_stride, int group, int cnt,
                                              float* ml, int64_t ml_head_stride) {
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int nwarps = static_cast<int>(blockDim.x >> 5);
  for (int g = warp; g < group; g += nwarps) {
    float* s = sc + g * g_stride;
    float m = -INFINITY;
    for (int t = lane; t < cnt; t += 32) m = fmaxf(m, s[t * t_stride]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float l = 0.0f;
    for (int t = lane; t < cnt; t += 32) {
      const float e = expf(s[t * t_stride] - m);
      s[t * t_stride] = e;
      l = l + e;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
    if (lane == 0) {
      ml[g * ml_head_stride] = m;
      ml[g * ml_head_stride + 1] = l;
    }
  }
}

// Block (split c, KV head kh, row r): positions [c * kAttnSplit, ...) of [0, position], every query head of
// the group: scores, the split's max and sum of exponentials, the unnormalised sum of p * v.
template <bool BF16>
__global__ void __launch_bounds__(kBlock) attn_partial_kernel(AttentionLaunch a, int r0, const float* qbuf,
                                                              float* part_o, float* part_ml, int splits) {
  pdl_enter();
  extern __shared__ float sm[];
  const int D = a.head_dim;
  const int group = a.num_heads / a.num_kv_heads;
  float* qs = sm;              // [group][D]
  float* sc = sm + group * D;  // [group][kAttnSplit]
  const int c = static_cast<int>(blockIdx.x), kh = static_cast<int>(blockIdx.y),
            r = static_cast<int>(blockIdx.z);
  const int32_t pos = a.positions[(r0 + r) * a.position_stride];
  if (pos < 0 || pos >= a.capacity) return;
  const int n = pos + 1;
  const int start = c * kAttnSplit;
  if (start >= n) return;
  const int cnt = n - start < kAttnSplit ? n - start : kAttnSplit;
  const int64_t q0 = (static_cast<int64_t>(r) * a.num_heads + static_cast<int64_t>(kh) * group) * D;
  for (int i = threadIdx.x; i < group * D; i += blockDim.x) qs[i] = qbuf[q0 + i];
  __syncthreads();

  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int nwarps = static_cast<int>(blockDim.x >> 5);
  const int64_t kvw = static_cast<int64_t>(a.num_kv_heads) * D;
  const float scale = static_cast<float>(1.0 / sqrt(static_cast<double>(D)));
  // Scores: one warp per position, lanes over 8-element chunks of the head, xor butterfly.
  for (int t = warp; t < cnt; t += nwarps) {
    const int64_t row = static_cast<int64_t>(start + t) * kvw + static_cast<int64_t>(kh) * D;
    float p[kMaxGroup] = {};
    for (int ch = lane; ch < D / 8; ch += 32) {
      float kv[8];
      load_kv8<BF16>(a.cache_k, row + ch * 8, kv);
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g < group) {
#pragma unroll
          for (int j = 0; j < 8; ++j) p[g] = fmaf(qs[g * D + ch * 8 + j], kv[j], p[g]);
        }
      }
    }
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g < group) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) p[g] += __shfl_xor_sync(0xffffffffu, p[g], off);
        if (lane == 0) sc[g * kAttnSplit + t] = p[g] * scale;
      }
    }
  }
  __syncthreads();
  split_softmax(sc, 1, kAttnSplit, group, cnt,
                part_ml + (static_cast<int64_t>(r) * a.num_heads + kh * group) * splits * 2 + c * 2,
                splits * 2);
  __syncthreads();
  // sum_t p_t * v_t in ascending t, one thread per head dim, every query head of the group at once.
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc[kMaxGroup] = {};
#pragma unroll 8
    for (int t = 0; t < cnt; ++t) {
      const float v =
          load_kv1<BF16>(a.cache_v, static_cast<int64_t>(start + t) * kvw + static_cast<int64_t>(kh) * D + d);
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g < group) acc[g] = fmaf(sc[g * kAttnSplit + t], v, acc[g]);
      }
    }
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g < group) {
        part_o[((static_cast<int64_t>(r) * a.num_heads + kh * group + g) * splits + c) * D + d] = acc[g];
      }
    }
  }
}

// The same arithmetic for a bf16 cache when the group has at most kStagedGroup query heads and a head at
// most 256 dims: the split's keys and values are copied to shared memory asynchronously (cp.async, every
// copy in flight at once), each lane keeps its 8-dim chunk of every query of the group in registers, and the
// scores are stored position-major so that one thread reads the group's probabilities of a position with
// two 16-byte loads. Sums run in the generic kernel's order, so the results are bitwise the same.
constexpr int kStagedGroup = 8;

__global__ void __launch_bounds__(kBlock)
    attn_partial_staged_kernel(AttentionLaunch a, int r0, const float* qbuf, float* part_o, float* part_ml,
                               int splits) {
  pdl_enter();
  extern __shared__ float sm[];
  const int D = a.head_dim;
  const int group = a.num_heads / a.num_kv_heads;
  float* sc = sm;  // [kAttnSplit][kStagedGroup]
  uint16_t* ktile = reinterpret_cast<uint16_t*>(sc + kAttnSplit * kStagedGroup);  // [kAttnSplit][D]
  uint16_t* vtile = ktile + kAttnSplit * D;
  const int c = static_cast<int>(blockIdx.x), kh = static_cast<int>(blockIdx.y),
            r = static_cast<int>(blockIdx.z);
  const int32_t pos = a.positions[(r0 + r) * a.position_stride];
  if (pos < 0 || pos >= a.capacity) return;
  const int n = pos + 1;
  const int start = c * kAttnSplit;
  if (start >= n) return;
  const int cnt = n - start < kAttnSplit ? n - start : kAttnSplit;
  const int64_t kvw = static_cast<int64_t>(a.num_kv_heads) * D;
  const int per_row = D / 8;
  {
    const uint16_t* kc = static_cast<const uint16_t*>(a.cache_k);
    const uint16_t* vc = static_cast<const uint16_t*>(a.cache_v);
    for (int i = threadIdx.x; i < cnt * per_row; i += blockDim.x) {
      const int t = i / per_row, ch = i % per_row;
      const int64_t at = static_cast<int64_t>(start + t) * kvw + static_cast<int64_t>(kh) * D + ch * 8;
      copy16_async(ktile + static_cast<int64_t>(i) * 8, kc + at);
      copy16_async(vtile + static_cast<int64_t>(i) * 8, vc + at);
    }
  }
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int nwarps = static_cast<int>(blockDim.x >> 5);
  const bool has_chunk = lane < per_row;
  float q[kStagedGroup][8];
  {
    const float* qb = qbuf + (static_cast<int64_t>(r) * a.num_heads + static_cast<int64_t>(kh) * group) * D;
#pragma unroll
    for (int g = 0; g < kStagedGroup; ++g) {
#pragma unroll
      for (int j = 0; j < 8; ++j) q[g][j] = g < group && has_chunk ? qb[g * D + lane * 8 + j] : 0.0f;
    }
  }
  copy_async_wait_all();
  __syncthreads();
  const float scale = static_cast<float>(1.0 / sqrt(static_cast<double>(D)));
  for (int t = warp; t < cnt; t += nwarps) {
    float p[kStagedGroup] = {};
    if (has_chunk) {
      float kv[8];
      load_kv8<true>(ktile, static_cast<int64_t>(t) * D + lane * 8, kv);
#pragma unroll
      for (int g = 0; g < kStagedGroup; ++g) {
#pragma unroll
        for (int j = 0; j < 8; ++j) p[g] = fmaf(q[g][j], kv[j], p[g]);
      }
    }
#pragma unroll
    for (int g = 0; g < kStagedGroup; ++g) {
      if (g < group) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) p[g] += __shfl_xor_sync(0xffffffffu, p[g], off);
        if (lane == 0) sc[t * kStagedGroup + g] = p[g] * scale;
      }
    }
  }
  __syncthreads();
  split_softmax(sc, kStagedGroup, 1, group, cnt,
                part_ml + (static_cast<int64_t>(r) * a.num_heads + kh * group) * splits * 2 + c * 2,
                splits * 2);
  __syncthreads();
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc[kStagedGroup] = {};
#pragma unroll 4
    for (int t = 0; t < cnt; ++t) {
      const float v = bf16_bits(vtile[t * D + d]);
      const float4 p0 = *reinterpret_cast<const float4*>(sc + t * kStagedGroup);
      const float4 p1 = *reinterpret_cast<const float4*>(sc + t * kStagedGroup + 4);
      const float pg[kStagedGroup] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
#pragma unroll
      for (int g = 0; g < kStagedGroup; ++g) acc[g] = fmaf(pg[g], v, acc[g]);
    }
#pragma unroll
    for (int g = 0; g < kStagedGroup; ++g) {
      if (g < group) {
        part_o[((static_cast<int64_t>(r) * a.num_heads + kh * group + g) * splits + c) * D + d] = acc[g];
      }
    }
  }
}

// Per (row, query head): the splits' partial results scaled to the common maximum M, summed in ascending
// split order, l = sum_c l_c e^(m_c - M) and o = sum_c o_c e^(m_c - M); out = (o / l) * sigmoid(gate). The
// per-split loads are independent, so they are in flight together.
__global__ void attn_merge_kernel(AttentionLaunch a, int r0, const float* part_o, const float* part_ml,
                                  int splits) {
  pdl_enter();
  const int r = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y);
  const int gr = r0 + r;
  const int D = a.head_dim;
  const int32_t pos = a.positions[gr * a.position_stride];
  float* out = a.out + gr * a.out_stride + static_cast<int64_t>(h) * D;
  const float* gate = a.qg + gr * a.qg_stride + static_cast<int64_t>(h) * 2 * D + D;
  const bool valid = pos >= 0 && pos < a.capacity;
  const int nsplit = valid ? (pos + kAttnSplit) / kAttnSplit : 0;
  const int64_t base = (static_cast<int64_t>(r) * a.num_heads + h) * splits;
  float mx = -INFINITY;
#pragma unroll 8
  for (int c = 0; c < nsplit; ++c) mx = fmaxf(mx, part_ml[(base + c) * 2]);
  float l = 0.0f;
#pragma unroll 8
  for (int c = 0; c < nsplit; ++c) l = l + part_ml[(base + c) * 2 + 1] * expf(part_ml[(base + c) * 2] - mx);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.0f;
#pragma unroll 8
    for (int c = 0; c < nsplit; ++c) o = o + part_o[(base + c) * D + d] * expf(part_ml[(base + c) * 2] - mx);
    out[d] = valid ? (o / l) * sigmoidf_(gate[d]) : 0.0f;
  }
}

}  // namespace

size_t attention_smem_bytes(int num_heads, int num_kv_heads, int head_dim, bool staged) {
  if (staged) {
    return static_cast<size_t>(kAttnSplit) * kStagedGroup * sizeof(float) +
           2 * static_cast<size_t>(kAttnSplit) * head_dim * sizeof(uint16_t);
  }
  const size_t group = static_cast<size_t>(num_heads / num_kv_heads);
  return group * (head_dim + kAttnSplit) * sizeof(float);
}

void set_attention_smem_limit(size_t bytes) {
  cudaFuncSetAttribute(attn_partial_staged_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(bytes));
}

namespace {

int num_splits(int64_t capacity) {
  return static_cast<int>((capacity + kAttnSplit - 1) / kAttnSplit);
}

}  // namespace

int64_t attention_scratch_floats(int num_heads, int head_dim, int64_t capacity) {
  const int64_t per_row = static_cast<int64_t>(num_heads) * head_dim * (1 + num_splits(capacity)) +
                          static_cast<int64_t>(num_heads) * num_splits(capacity) * 2;
  return kMaxRows * per_row;
}

void launch_attention(const AttentionLaunch& a, cudaStream_t stream) {
  const int D = a.head_dim;
  const int splits = num_splits(a.capacity);
  float* qbuf = a.scratch;
  float* part_o = qbuf + static_cast<int64_t>(kMaxRows) * a.num_heads * D;
  float* part_ml = part_o + static_cast<int64_t>(kMaxRows) * a.num_heads * splits * D;
  const bool staged = a.cache_bf16 && a.num_heads / a.num_kv_heads <= kStagedGroup && D <= 256 &&
                      attention_smem_bytes(a.num_heads, a.num_kv_heads, D, true) <= a.smem_limit;
  const size_t partial_smem = attention_smem_bytes(a.num_heads, a.num_kv_heads, D, staged);
  for (int r0 = 0; r0 < a.rows; r0 += kMaxRows) {
    const int n = a.rows - r0 < kMaxRows ? a.rows - r0 : kMaxRows;
    launch_pdl(qk_norm_rope_kernel, dim3(n, a.num_heads + a.num_kv_heads), dim3(128), D * sizeof(float),
               stream, a, r0, qbuf);
    const dim3 grid(splits, a.num_kv_heads, n);
    if (staged) {
      launch_pdl(attn_partial_staged_kernel, grid, dim3(kBlock), partial_smem, stream, a, r0,
                 static_cast<const float*>(qbuf), part_o, part_ml, splits);
    } else if (a.cache_bf16) {
      launch_pdl(attn_partial_kernel<true>, grid, dim3(kBlock), partial_smem, stream, a, r0,
                 static_cast<const float*>(qbuf), part_o, part_ml, splits);
    } else {
      launch_pdl(attn_partial_kernel<false>, grid, dim3(kBlock), partial_smem, stream, a, r0,
                 static_cast<const float*>(qbuf), part_o, part_ml, splits);
    }
    launch_pdl(attn_merge_kernel, dim3(n, a.num_heads), dim3(128), 0, stream, a, r0,
               static_cast<const float*>(part_o), static_cast<const float*>(part_ml), splits);
  }
}

}  // namespace pd::cuda
