// Gated full attention after the projections (backend.h GatedAttentionArgs; spec §4): the entry point, the
// query / key preparation, the merge of split-K partials, and the CUDA-core kernels kept for float32 caches.
// 1. per (row, head): RMSNorm of the query / key head, NeoX RoPE at the row's position; keys and values are
//    written to the cache at that position, queries to scratch (every row of a launch before any attention);
// 2. attention, by one of three paths (path_of):
//    - prefill (more than kMaxRows rows, bf16 cache): causal flash attention, attention_prefill.cu;
//    - decode / verify (bf16 cache): split-K on the tensor cores, each KV head's keys read once for all its
//      query heads and rows, attention_decode.cu, then the merge below (with the gate);
//    - float32 cache: split-K over kAttnSplit-key splits on the CUDA cores, one block per (split, KV head,
//      row), then the merge.
// Split points depend only on the row's position, and every reduction runs in a fixed order, so each row's
// result is independent of the other rows (docs/DESIGN.md §4.1). Steps wider than kMaxRows on the other
// paths run in chunks of kMaxRows rows; rows of a chunk see the keys written by earlier rows.
#include "puredrive/backend/cuda/attention_mma.cuh"
#include "puredrive/backend/cuda/common.cuh"
#include "puredrive/backend/cuda/trace.cuh"

namespace pd::cuda {
namespace {

__global__ void qk_norm_rope_kernel(AttentionLaunch a, int r0, float* qbuf) {
  PD_TRACE_SCOPE(kQkNormRope, gridDim.x);
  pdl_enter();
  PD_TRACE_STAMP(0);
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

// Per (row, query head): the splits' partials scaled to the common maximum M, l = sum_c l_c e^(m_c - M) and
// o = sum_c o_c e^(m_c - M); out = (o / l) * sigmoid(gate). Partials of row r0 + r sit at row r of part_o /
// part_ml, `stride` splits per (row, head). A block merges kMergeDims dims of one (row, head) with
// kMergeLanes lanes of 4 dims times kMergeChunks chunks of the splits (chunk k sums splits k, k + 16, ... in
// ascending order, then the chunks are added in ascending order); l is a fixed-order block sum. The order
// depends only on the split count, so a row's result is independent of the other rows. One thread per dim
// looping over all splits took 19 us per layer at 128K keys (ncu; 129 dependent round trips to L2).
// ADAPTIVE: the splits of attention_plan.h (their factors e^(m_c - M) computed once into shared memory);
// else kAttnSplit-key splits (the CUDA-core kernel), whose count the shared memory does not bound.
constexpr int kMergeThreads = 256;
constexpr int kMergeLanes = 16;
constexpr int kMergeChunks = kMergeThreads / kMergeLanes;
constexpr int kMergeDims = 4 * kMergeLanes;

template <bool ADAPTIVE>
__global__ void __launch_bounds__(kMergeThreads)
    attn_merge_kernel(AttentionLaunch a, int r0, const float* part_o, const float* part_ml, int stride) {
  PD_TRACE_SCOPE(kAttnMerge, gridDim.x);
  pdl_enter();
  PD_TRACE_STAMP(0);
  __shared__ float w[ADAPTIVE ? kAttnItems : 1];
  __shared__ float red[kMergeThreads / 32];
  __shared__ float sums[kMergeChunks][kMergeDims];
  const int r = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y);
  const int d0 = static_cast<int>(blockIdx.z) * kMergeDims, tid = static_cast<int>(threadIdx.x);
  const int gr = r0 + r;
  const int D = a.head_dim;
  const int32_t pos = a.positions[gr * a.position_stride];
  float* out = a.out + gr * a.out_stride + static_cast<int64_t>(h) * D;
  const float* gate = a.qg + gr * a.qg_stride + static_cast<int64_t>(h) * 2 * D + D;
  const bool valid = pos >= 0 && pos < a.capacity;
  int nsplit = 0;
  if (valid) nsplit = ADAPTIVE ? attn_num_splits(pos, a.num_kv_heads) : (pos + kAttnSplit) / kAttnSplit;
  const int64_t base = (static_cast<int64_t>(r) * a.num_heads + h) * stride;
  float mx = -INFINITY;
  for (int c = tid; c < nsplit; c += kMergeThreads) mx = fmaxf(mx, part_ml[(base + c) * 2]);
  mx = block_max(mx, red);
  float lsum = 0.0f;
  for (int c = tid; c < nsplit; c += kMergeThreads) {
    const float f = expf(part_ml[(base + c) * 2] - mx);
    if constexpr (ADAPTIVE) w[c] = f;
    lsum = lsum + part_ml[(base + c) * 2 + 1] * f;
  }
  const float l = block_sum(lsum, red);  // its barriers also publish w
  const int lane = tid % kMergeLanes, chunk = tid / kMergeLanes, d = d0 + 4 * lane;
  float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
  for (int c = chunk; c < nsplit; c += kMergeChunks) {
    float f;
    if constexpr (ADAPTIVE) {
      f = w[c];
    } else {
      f = expf(part_ml[(base + c) * 2] - mx);
    }
    const float* src = part_o + (base + c) * D + d;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (d + e < D) o[e] = o[e] + src[e] * f;
    }
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) sums[chunk][4 * lane + e] = o[e];
  __syncthreads();
  if (tid < kMergeDims && d0 + tid < D) {
    float acc = 0.0f;
#pragma unroll
    for (int ch = 0; ch < kMergeChunks; ++ch) acc = acc + sums[ch][tid];
    out[d0 + tid] = valid ? (acc / l) * sigmoidf_(gate[d0 + tid]) : 0.0f;
  }
}

void launch_merge(bool adaptive, const AttentionLaunch& a, int r0, int rows, const float* part_o,
                  const float* part_ml, int stride, cudaStream_t stream) {
  const dim3 grid(rows, a.num_heads, (a.head_dim + kMergeDims - 1) / kMergeDims);
  if (adaptive) {
    launch_pdl(attn_merge_kernel<true>, grid, dim3(kMergeThreads), 0, stream, a, r0, part_o, part_ml, stride);
  } else {
    launch_pdl(attn_merge_kernel<false>, grid, dim3(kMergeThreads), 0, stream, a, r0, part_o, part_ml,
               stride);
  }
}

int legacy_splits(int64_t capacity) {
  return static_cast<int>((capacity + kAttnSplit - 1) / kAttnSplit);
}

enum class Path { kPrefill, kDecode, kLegacy };

// Steps wider than kMaxRows take the flash kernel; the rest the split-K decode kernel on the tensor cores
// (wide steps too when the flash kernel lacks their head dim); a float32 cache, or a shape neither supports,
// the CUDA-core kernels.
Path path_of(const AttentionLaunch& a) {
  if ((a.rows > kMaxRows || a.prefill) && attn_prefill_supported(a)) return Path::kPrefill;
  return attn_decode_supported(a) ? Path::kDecode : Path::kLegacy;
}

}  // namespace

void set_attention_smem_limit(size_t bytes) {
  set_attn_decode_smem_limit(bytes);
  set_attn_prefill_smem_limit(bytes);
}

int64_t attention_scratch_floats(const AttentionLaunch& a) {
  const int64_t hq = a.num_heads, D = a.head_dim;
  if (path_of(a) == Path::kPrefill) return static_cast<int64_t>(a.rows) * hq * D;
  const int64_t splits =
      path_of(a) == Path::kDecode ? attn_max_splits(a.num_kv_heads) : legacy_splits(a.capacity);
  return kMaxRows * hq * (D + splits * (D + 2));
}

void launch_attention(const AttentionLaunch& a, cudaStream_t stream) {
  const int D = a.head_dim, hq = a.num_heads;
  float* qbuf = a.scratch;
  const Path path = path_of(a);
  PD_TRACE_ENSURE();
  if (path == Path::kPrefill) {
    launch_pdl(qk_norm_rope_kernel, dim3(a.rows, hq + a.num_kv_heads), dim3(128), D * sizeof(float), stream,
               a, 0, qbuf);
    launch_attn_prefill(a, qbuf, stream);
    return;
  }
  const int splits = path == Path::kDecode ? attn_max_splits(a.num_kv_heads) : legacy_splits(a.capacity);
  float* part_o = qbuf + static_cast<int64_t>(kMaxRows) * hq * D;
  float* part_ml = part_o + static_cast<int64_t>(kMaxRows) * hq * splits * D;
  const int per_launch = path == Path::kDecode ? attn_decode_rows_per_launch(a) : kMaxRows;
  for (int r0 = 0; r0 < a.rows; r0 += kMaxRows) {
    const int n = a.rows - r0 < kMaxRows ? a.rows - r0 : kMaxRows;
    launch_pdl(qk_norm_rope_kernel, dim3(n, hq + a.num_kv_heads), dim3(128), D * sizeof(float), stream, a, r0,
               qbuf);
    if (path == Path::kLegacy) {
      const dim3 grid(splits, a.num_kv_heads, n);
      const size_t smem = static_cast<size_t>(hq / a.num_kv_heads) * (D + kAttnSplit) * sizeof(float);
      if (a.cache_bf16) {
        launch_pdl(attn_partial_kernel<true>, grid, dim3(kBlock), smem, stream, a, r0,
                   static_cast<const float*>(qbuf), part_o, part_ml, splits);
      } else {
        launch_pdl(attn_partial_kernel<false>, grid, dim3(kBlock), smem, stream, a, r0,
                   static_cast<const float*>(qbuf), part_o, part_ml, splits);
      }
      launch_merge(false, a, r0, n, part_o, part_ml, splits, stream);
      continue;
    }
    // Rows in launches of per_launch (all of them unless the shared memory limit says otherwise); a row's
    // result does not depend on which rows share its launch.
    for (int s0 = 0; s0 < n; s0 += per_launch) {
      const int m = n - s0 < per_launch ? n - s0 : per_launch;
      launch_attn_decode(a, r0 + s0, m, qbuf + static_cast<int64_t>(s0) * hq * D, part_o, part_ml, stream);
      launch_merge(true, a, r0 + s0, m, part_o, part_ml, splits, stream);
    }
  }
}

}  // namespace pd::cuda
