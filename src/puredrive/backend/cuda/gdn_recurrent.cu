// The GDN step of a decode/verify chunk (spec §5): the causal conv, the recurrence and the gated norm in one
// kernel, split by value columns: the S blocks of value head h own columns [c Dv / S, (c + 1) Dv / S) each
// (c < S), and thread (j, part) owns column j, state rows [part Dk / 4, (part + 1) Dk / 4). A cluster is
// the S blocks of each value head that shares key head kh (GQA ratio x S blocks).
//
// Conv (depthwise, Kc taps, SiLU): each thread carries the Kc - 1 window of its column's v channel (the four
// parts of a column compute the same value; part 0 writes it), threads t < Dk those of q and k channel t of
// key head kh, which every block of the cluster computes alike. Their windows are written back by cluster
// rank 0 after the cluster's barrier, once every block has read them. Merged into the recurrence, the conv
// is no longer a launch of its own whose outputs the recurrence waited for.
//
// Rows go in groups of kRowGroup: the group's inputs are loaded at once and its q and k l2norms computed
// together (fixed-order block sums, one barrier pass for the group), so the rows' recurrence itself runs
// without a barrier or a memory wait: decay, delta rule, readout (sums over the key dim ascending inside a
// thread, then ((p0 + p1) + (p2 + p3)) across the four parts), the per-row state snapshot. The gated RMSNorm
// needs the sum of o^2 over the head: each block sums its columns per row (once per group), sends the sums to
// the head's other blocks once after the last row (into their shared memory), and every block adds them in
// block order. A row's results depend only on the state before it and its own inputs, and every sum has
// the same order whatever the group holds, so the split and the grouping change nothing across R.
#include "puredrive/backend/cuda/common.cuh"
#include "puredrive/backend/cuda/trace.cuh"

namespace pd::cuda {
namespace {

constexpr int kMaxSplit = 4;
// The fast kernels: a conv of 4 taps (every published model's) and at most 256 threads per block, so that the
// taps are a constant and ptxas may take 255 registers (under a 512-thread bound, 128: the kernels spilled).
// The others take windows of kMaxConvKernel and the tap count at run time.
constexpr int kFastConv = 4;
constexpr int kFastThreads = 256;
constexpr int kMaxCluster = 8;  // blocks per cluster (the portable limit): GQA ratio x split
constexpr int kRowGroup = 8;  // rows whose inputs are loaded and normalised together (PD_GDN_ROW_GROUP=0: 1)
// The fast kernels' group for steps of at most this many rows (an MTP verify step of K = 2 or 3 drafts): each
// row of a group is straight-line code that runs once per launch, cold in the instruction cache, so a smaller
// group is a smaller kernel (ncu, ae46886: 22-30% of a 3-row launch's samples waited for instructions).
constexpr int kSmallRowGroup = 4;
constexpr int kMaxWarps = 16;  // 512 threads
// q and k of a row in shared memory: part p's RPT values (state rows [p RPT, (p + 1) RPT)) start at
// p (RPT + kPartPad), so that the four parts of a warp read from four different groups of banks, 16 bytes at
// a time (unpadded, the parts' reads fell in the same banks: 67-69% of the kernel's shared wavefronts were
// conflicts, ncu, bench/results/2026-12-04-h200-ea365f0.md).
constexpr int kPartPad = 4;
__device__ __forceinline__ int qk_slot(int i, int rpt) {
  return i + kPartPad * (i / rpt);
}

// N fixed-order block sums at once (block_sum's order: the xor butterfly in each warp, then the warps' sums
// in ascending order), with one pass of barriers; the sums land in tot[0..N).
template <int N>
__device__ __forceinline__ void block_sums(float v[N], float (*red)[kMaxWarps], float* tot) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v[i] += __shfl_xor_sync(0xffffffffu, v[i], off);
  }
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  __syncthreads();  // red and tot may still be read by a previous call
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) red[i][warp] = v[i];
  }
  __syncthreads();
  const int t = static_cast<int>(threadIdx.x);
  if (t < N) {
    float s = red[t][0];
    const int nw = static_cast<int>(blockDim.x >> 5);
    for (int w = 1; w < nw; ++w) s = s + red[t][w];
    tot[t] = s;
  }
  __syncthreads();
}

// One conv channel c: win, its last Kc - 1 inputs (oldest first), and its Kc taps w (global memory, read per
// row: in registers, three channels' taps made the verify kernels spill). KC >= Kc sizes the window, an array
// indexed by constants only, so that it stays in registers.
template <int KC>
__device__ __forceinline__ void conv_load(const GdnLaunch& g, int64_t C, int64_t c, float (&win)[KC]) {
#pragma unroll
  for (int j = 0; j < KC; ++j) win[j] = j < g.conv_kernel - 1 ? g.conv_state[j * C + c] : 0.0f;
}
// silu(sum_j w[j] win[j]) with x as the newest input, taps in ascending order; x enters the window.
template <int KC>
__device__ __forceinline__ float conv_step(float x, int kc, float (&win)[KC], const float* w) {
#pragma unroll
  for (int j = 0; j < KC; ++j) {
    if (j == kc - 1) win[j] = x;
  }
  float acc = __ldg(w) * win[0];
#pragma unroll
  for (int j = 1; j < KC; ++j) {
    if (j < kc) acc = acc + __ldg(w + j) * win[j];
  }
#pragma unroll
  for (int j = 0; j + 1 < KC; ++j) {
    if (j < kc - 1) win[j] = win[j + 1];
  }
  return siluf_(acc);
}
// The window to dst[j * C + c] (the conv state's layout, or a row's snapshot).
template <int KC>
__device__ __forceinline__ void conv_store(float* dst, int64_t C, int64_t c, int kc, const float (&win)[KC]) {
#pragma unroll
  for (int j = 0; j + 1 < KC; ++j) {
    if (j < kc - 1) dst[j * C + c] = win[j];
  }
}

template <int RPT, int G, bool FAST>
__global__ void __launch_bounds__(FAST ? kFastThreads : 512)
    gdn_step_kernel(GdnLaunch g, int r0, int rows, int split) {
  constexpr int KC = FAST ? kFastConv : kMaxConvKernel;
  PD_TRACE_SCOPE(kGdnRecurrent, rows);
  pdl_enter();
  PD_TRACE_STAMP(0);
  constexpr int kParts = 4;
  const int Dk = RPT * kParts;
  const int Dv = g.v_head_dim;
  const int cols = Dv / split;
  __shared__ __align__(16) float qs[G][(RPT + kPartPad) * kParts], ks[G][(RPT + kPartPad) * kParts];
  __shared__ float red[2 * G][kMaxWarps];
  __shared__ float tot[2 * G];
  __shared__ float beta_s[G], alpha_s[G];         // the group's gates (per head: one thread per row)
  __shared__ float o_part[kGdnChunk];             // this block's sum of o^2 per row
  __shared__ float o_peer[kMaxSplit][kGdnChunk];  // the head's blocks' o_part, by block, sent by them
  __shared__ uint64_t o_bar;                      // completes when every o_peer value has come
  extern __shared__ float o_raw[];                // [rows][cols]: readout before the gated norm
  const int h = static_cast<int>(blockIdx.x) / split;
  const int c = static_cast<int>(blockIdx.x) % split;  // this block's cluster rank is rank_base + c
  const int kh = h / (g.num_v_heads / g.num_k_heads);
  const int tid = static_cast<int>(threadIdx.x);
  const int jl = tid / kParts, part = tid % kParts;
  const int j = c * cols + jl;
  const int i0 = part * RPT;
  const int key_dim = g.num_k_heads * Dk;
  const int C = 2 * key_dim + g.num_v_heads * Dv;
  const int64_t head_size = static_cast<int64_t>(Dk) * Dv;
  const int kc = FAST ? kFastConv : g.conv_kernel;
  const int rank_base = (h % (g.num_v_heads / g.num_k_heads)) * split;  // this head's first cluster rank
  const bool qk_owner = rank_base + c == 0;                             // writes q and k's windows
  const int cq = kh * Dk + tid, ck = key_dim + kh * Dk + tid, cv = 2 * key_dim + h * Dv + j;
  const int slot = qk_slot(tid, RPT);  // this thread's q and k channel (tid < Dk)
  const int mine = qk_slot(i0, RPT);   // this thread's part
  if (tid == 0) {
    mbar_init(&o_bar, 1);
    mbar_expect(&o_bar, static_cast<uint32_t>(split * rows * sizeof(float)));
    mbar_init_fence();
  }
  float win_q[KC], win_k[KC], win_v[KC];
  if (tid < Dk) {
    conv_load(g, C, cq, win_q);
    conv_load(g, C, ck, win_k);
  }
  conv_load(g, C, cv, win_v);
  const float* taps_q = g.conv1d + static_cast<int64_t>(cq) * kc;
  const float* taps_k = g.conv1d + static_cast<int64_t>(ck) * kc;
  const float* taps_v = g.conv1d + static_cast<int64_t>(cv) * kc;
  // The first row's output gate, loaded with the inputs rather than after the cluster's barrier at the end.
  const float z_first = part == 0 ? g.z[r0 * g.z_stride + static_cast<int64_t>(h) * Dv + j] : 0.0f;
  float* state = g.recurrent + h * head_size;
  float s[RPT];
#pragma unroll
  for (int ii = 0; ii < RPT; ++ii) s[ii] = state[static_cast<int64_t>(i0 + ii) * Dv + j];
  const float neg_a = -expf(g.A_log[h]);
  const float dt_bias = g.dt_bias[h];
  const float q_scale = static_cast<float>(1.0 / sqrt(static_cast<double>(Dk)));
  for (int first = 0; first < rows; first += G) {
    const int n = min(G, rows - first);
    // The group's inputs, all loads in flight together, q and k raw into this thread's slots of shared memory
    // (held in registers with the gates, they took the grouped kernel to 28.2 us at three rows where conv +
    // recurrence had taken 19.9, ncu); then the conv, row by row.
    float vv[G];
#pragma unroll
    for (int r = 0; r < G; ++r) {
      const bool ok = r < n;
      const int64_t gr = r0 + first + r;
      const float* x = g.qkv + gr * g.qkv_stride;
      if (tid < Dk) {
        qs[r][slot] = ok ? x[cq] : 0.0f;
        ks[r][slot] = ok ? x[ck] : 0.0f;
      }
      vv[r] = ok ? x[cv] : 0.0f;
    }
    if (tid < n) {  // read after the barriers of the block sums below
      const int64_t gr = r0 + first + tid;
      beta_s[tid] = sigmoidf_(g.b[gr * g.b_stride + h]);
      alpha_s[tid] = expf(neg_a * softplusf_(g.a[gr * g.a_stride + h] + dt_bias));
    }
    float sq[2 * G];
#pragma unroll
    for (int r = 0; r < G; ++r) {
      float qv = 0.0f, kv = 0.0f;
      if (r < n) {
        float* snap = g.snap_conv != nullptr ? g.snap_conv + (r0 + first + r) * g.snap_conv_stride : nullptr;
        if (tid < Dk) {
          qv = conv_step(qs[r][slot], kc, win_q, taps_q);
          kv = conv_step(ks[r][slot], kc, win_k, taps_k);
          if (snap != nullptr && qk_owner) {
            conv_store(snap, C, cq, kc, win_q);
            conv_store(snap, C, ck, kc, win_k);
          }
        }
        vv[r] = conv_step(vv[r], kc, win_v, taps_v);
        if (snap != nullptr && part == 0) conv_store(snap, C, cv, kc, win_v);
      }
      if (tid < Dk) {
        qs[r][slot] = qv;
        ks[r][slot] = kv;
      }
      sq[2 * r] = qv * qv;
      sq[2 * r + 1] = kv * kv;
    }
    // l2norm(q) * Dk^-1/2 and l2norm(k), eps 1e-6 inside the root (FLA / HF).
    block_sums<2 * G>(sq, red, tot);
    // The conv windows are read (their values used) and o_bar is initialised: half of the cluster barrier
    // that cluster rank 0 waits on before it writes the q and k windows, and every block before it sends.
    if (first == 0) cluster_arrive_relaxed();
    if (tid < Dk) {
      for (int r = 0; r < n; ++r) {
        qs[r][slot] = (qs[r][slot] * (1.0f / sqrtf(tot[2 * r] + 1e-6f))) * q_scale;
        ks[r][slot] = ks[r][slot] * (1.0f / sqrtf(tot[2 * r + 1] + 1e-6f));
      }
    }
    __syncthreads();
    float o2[G];
#pragma unroll
    for (int r = 0; r < G; ++r) {
      o2[r] = 0.0f;
      if (r >= n) continue;
      const int64_t gr = r0 + first + r;
      const float beta = beta_s[r], alpha = alpha_s[r];
      const float4* k4 = reinterpret_cast<const float4*>(&ks[r][mine]);
      const float4* q4 = reinterpret_cast<const float4*>(&qs[r][mine]);
      float kvp = 0.0f;
#pragma unroll
      for (int ii = 0; ii < RPT; ii += 4) {
        const float4 k4v = k4[ii / 4];
        const float k[4] = {k4v.x, k4v.y, k4v.z, k4v.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[ii + e] = s[ii + e] * alpha;
          kvp = fmaf(s[ii + e], k[e], kvp);
        }
      }
      kvp += __shfl_xor_sync(0xffffffffu, kvp, 1);
      kvp += __shfl_xor_sync(0xffffffffu, kvp, 2);
      const float delta = (vv[r] - kvp) * beta;
      float op = 0.0f;
#pragma unroll
      for (int ii = 0; ii < RPT; ii += 4) {
        const float4 k4v = k4[ii / 4], q4v = q4[ii / 4];
        const float k[4] = {k4v.x, k4v.y, k4v.z, k4v.w}, q[4] = {q4v.x, q4v.y, q4v.z, q4v.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[ii + e] = fmaf(k[e], delta, s[ii + e]);
          op = fmaf(s[ii + e], q[e], op);
        }
      }
      op += __shfl_xor_sync(0xffffffffu, op, 1);
      op += __shfl_xor_sync(0xffffffffu, op, 2);
      if (g.snap_recurrent != nullptr) {
        float* snap = g.snap_recurrent + gr * g.snap_recurrent_stride + h * head_size;
#pragma unroll
        for (int ii = 0; ii < RPT; ++ii) snap[static_cast<int64_t>(i0 + ii) * Dv + j] = s[ii];
      }
      if (part == 0) {
        o_raw[(first + r) * cols + jl] = op;
        o2[r] = op * op;
      }
    }
    block_sums<G>(o2, red, tot);
    if (tid < n) o_part[first + tid] = tot[tid];
  }
#pragma unroll
  for (int ii = 0; ii < RPT; ++ii) state[static_cast<int64_t>(i0 + ii) * Dv + j] = s[ii];
  if (part == 0) conv_store(g.conv_state, C, cv, kc, win_v);
  // Gated RMSNorm, norm before gate: (w * (o * rsqrt(mean(o^2) + eps))) * silu(z), mean over the head. The
  // head's blocks send each other their sums of o^2 (store_remote, counted on o_bar). A cluster.sync()
  // here had to wait until this block's state and snapshot stores were acknowledged (release semantics):
  // 13-14% of a one-row launch's samples were MEMBAR stalls (ncu, ae46886).
  cluster_wait();
  if (qk_owner && tid < Dk) {
    conv_store(g.conv_state, C, cq, kc, win_q);
    conv_store(g.conv_state, C, ck, kc, win_k);
  }
  __syncthreads();  // o_part of the last group
  for (int t = tid; t < rows * split; t += static_cast<int>(blockDim.x)) {
    const int r = t / split, b = t - r * split;
    store_remote(&o_peer[c][r], o_part[r], &o_bar, static_cast<uint32_t>(rank_base + b));
  }
  mbar_wait(&o_bar, 0);
  for (int r = 0; r < rows; ++r) {
    float total = 0.0f;
    for (int b = 0; b < split; ++b) total = total + o_peer[b][r];
    if (part == 0) {
      const int64_t gr = r0 + r;
      const float inv = 1.0f / sqrtf(total / static_cast<float>(Dv) + g.eps);
      const float z = r == 0 ? z_first : g.z[gr * g.z_stride + static_cast<int64_t>(h) * Dv + j];
      g.out[gr * g.out_stride + static_cast<int64_t>(h) * Dv + j] =
          (g.norm[j] * (o_raw[r * cols + jl] * inv)) * siluf_(z);
    }
  }
}

// Blocks per value head: as many as keep every thread busy with one column and the key dim within the block,
// and a cluster (ratio of them per key head) within kMaxCluster.
int gdn_split(int k_head_dim, int v_head_dim, int ratio) {
  for (int s = kMaxSplit; s > 1; s /= 2) {
    if (v_head_dim % s == 0 && (4 * v_head_dim / s) % 32 == 0 && k_head_dim <= 4 * v_head_dim / s &&
        ratio * s <= kMaxCluster) {
      return s;
    }
  }
  return 1;
}

template <int RPT>
void launch_split(const GdnLaunch& g, int r0, int rows, int split, cudaStream_t stream) {
  const int ratio = g.num_v_heads / g.num_k_heads;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(g.num_v_heads * split));
  cfg.blockDim = dim3(static_cast<unsigned>(4 * g.v_head_dim / split));
  cfg.dynamicSmemBytes = static_cast<size_t>(kGdnChunk) * (g.v_head_dim / split) * sizeof(float);
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = static_cast<unsigned>(ratio * split);
  attr[1].val.clusterDim.y = 1;
  attr[1].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 2;
  PD_TRACE_ENSURE();
  // One-row steps take groups of one: the group's registers cost them about 1% of a step
  // (bench/results/2026-12-03-h200-6398cc3.md), and the sums are the same either way.
  static const bool grouped = env_switch_on("PD_GDN_ROW_GROUP");
  const bool fast = g.conv_kernel == kFastConv && cfg.blockDim.x <= kFastThreads;
  static const bool small_group = env_switch_on("PD_GDN_SMALL_GROUP");
  if (grouped && rows > 1 && fast && small_group && rows <= kSmallRowGroup) {
    cudaLaunchKernelEx(&cfg, gdn_step_kernel<RPT, kSmallRowGroup, true>, g, r0, rows, split);
  } else if (grouped && rows > 1) {
    cudaLaunchKernelEx(&cfg,
                       fast ? gdn_step_kernel<RPT, kRowGroup, true> : gdn_step_kernel<RPT, kRowGroup, false>,
                       g, r0, rows, split);
  } else {
    cudaLaunchKernelEx(&cfg, fast ? gdn_step_kernel<RPT, 1, true> : gdn_step_kernel<RPT, 1, false>, g, r0,
                       rows, split);
  }
}

}  // namespace

bool gdn_supported(int k_head_dim, int v_head_dim, int num_k_heads, int num_v_heads) {
  const bool dk_ok =
      k_head_dim == 16 || k_head_dim == 32 || k_head_dim == 64 || k_head_dim == 128 || k_head_dim == 256;
  return dk_ok && v_head_dim >= 8 && v_head_dim <= 128 && (4 * v_head_dim) % 32 == 0 &&
         k_head_dim <= 4 * v_head_dim && num_k_heads > 0 && num_v_heads % num_k_heads == 0 &&
         num_v_heads / num_k_heads <= kMaxCluster;
}

void launch_gdn_step(const GdnLaunch& g, int r0, int rows, cudaStream_t stream) {
  const int split = gdn_split(g.k_head_dim, g.v_head_dim, g.num_v_heads / g.num_k_heads);
  switch (g.k_head_dim) {
    case 16:
      launch_split<4>(g, r0, rows, split, stream);
      break;
    case 32:
      launch_split<8>(g, r0, rows, split, stream);
      break;
    case 64:
      launch_split<16>(g, r0, rows, split, stream);
      break;
    case 128:
      launch_split<32>(g, r0, rows, split, stream);
      break;
    default:
      launch_split<64>(g, r0, rows, split, stream);
      break;
  }
}

}  // namespace pd::cuda
