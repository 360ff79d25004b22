// The CUDA kernels' launch interface, shared by the host code (cuda_ops.cpp, cuda_layers.cpp, ..., compiled
// as C++) and the kernels (*.cu). Plain structs of device pointers and sizes; arguments arrive validated.
//
// Row-exactness (backend.h): every kernel computes each row's outputs with the same threads-to-elements
// mapping and the same reduction tree whatever the number of rows R, and the library is compiled with
// --fmad=false, so only the fmaf() written in the source fuse. Steps of more than kMaxRows rows run as
// consecutive chunks of kMaxRows rows through the same kernels, so prefill is row-exact too.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>

namespace pd::cuda {

// A kernel-choice switch for same-run comparisons: on unless the environment variable `name` starts with
// '0'. Callers read it once (a static), so one process never mixes kernels.
inline bool env_switch_on(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || v[0] != '0';
}

// An integer setting from the environment (atoi's reading), or `fallback` when `name` is unset.
inline int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : fallback;
}

constexpr int kMaxRows = 8;  // rows one launch of a weight-reading kernel handles (registers per thread)
constexpr int kBlock = 256;  // threads of a matrix-vector block: 8 warps, one output row per warp at a time
constexpr int kAttnSplit =
    128;  // float32-cache attention split-K: positions [c * kAttnSplit, (c + 1) * kAttnSplit)
constexpr int kMaxGroup = 16;      // query heads per KV head
constexpr int kMaxTopK = 32;       // experts per token
constexpr int kMaxConvKernel = 8;  // GDN conv taps

enum class WFmt : int32_t { kF32 = 0, kF16 = 1, kBF16 = 2, kAffine = 3 };
enum class SDType : int32_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

// A weight matrix W[rows, cols] in device memory (checkpoint/weights.h Matrix). For stacked experts, data,
// scales and biases point at expert 0 and the strides give the distance between experts in bytes.
struct DevMatrix {
  WFmt fmt = WFmt::kF32;
  int32_t bits = 0;        // affine
  int32_t group_size = 0;  // affine
  SDType scale_dtype = SDType::kBF16;
  int64_t rows = 0;
  int64_t cols = 0;  // a multiple of 8 (dense) or of 32 (affine)
  const void* data = nullptr;
  const void* scales = nullptr;
  const void* biases = nullptr;
  int64_t data_stride = 0;   // bytes between experts
  int64_t scale_stride = 0;  // bytes between experts (scales and biases)
};

// ---- Tiled products for wide steps (gemm_tiled.cu) ----
// Prefill (R > kMaxRows) may use other kernels than decode (docs/DESIGN.md §4.1): tiles of kTileRows
// activation rows x kTileCols weight rows, weights decoded once per tile into shared memory, f32
// accumulation over the columns in ascending order. Not row-exact across R (a row's result does not depend on
// R, but differs from the warp-split decode kernels' summation order).
constexpr int kTileRows = 64;
constexpr int kTileCols = 64;
// out[dst] (=|+=) x[src] . W^T for a list of activation rows. Without a list, rows 0..rows-1 map to
// themselves; with one, entry i of block z is v = list[z * list_stride + i] (i < count[z]), read from row
// v / list_div and written to row v, and W is expert z of a stacked matrix (data + z * data_stride).
// dual: out = silu(x . W^T) * (x . W2^T) (the experts' gate/up pair).
struct TileJob {
  DevMatrix w, w2;
  bool dual = false;
  const float* x = nullptr;
  int64_t xs = 0;
  const int* list = nullptr;
  int64_t list_stride = 0;
  int list_div = 1;
  const int* count = nullptr;
  int rows = 0;  // without a list
  float* out = nullptr;
  int64_t os = 0;
  bool accumulate = false;
};
// groups: experts (grid z) when the job has a list, else 1; max_rows bounds the rows of any group.
void launch_tiled(const TileJob& j, int groups, int max_rows, cudaStream_t stream);

// ---- Tensor-core products for prefill (gemm_mma.cu) ----
// A prefill step (MatmulArgs::prefill, or R > kMaxRows) runs its products on the tensor cores (mma.sync
// m16n8k16, bf16 inputs, f32 accumulation) in tiles of kMmaRows activation rows x kMmaCols weight rows.
// Precision: each f32 activation is split into bf16 hi + lo (x = hi + lo to 16 significant bits), each
// weight likewise unless it is bf16 already (exact) or affine (its codes centred to q - 2^(b-1) are exact,
// and each group's sum is scaled once), and a product is hi*hi + lo*hi (+ hi*lo), so results agree with the
// f32 CPU backend to about 1e-5 relative. Every output element sums over the columns in ascending stages of
// kMmaK in one fixed order, and its value depends only on its own activation row and weight row: not on R,
// on the row's place in its tile, or on the other rows (docs/DESIGN.md §4.6).
constexpr int kMmaRows = 64;
constexpr int kMmaCols = 128;      // weight rows per tile (a gate/up pair: 64 outputs, rows interleaved)
constexpr int kMmaColsWide = 256;  // the same for bf16 weights (mma_tile_cols)
constexpr int kMmaMaxParts = 4;
// A part: one matrix (or a gate/up pair) applied to a set of activation rows. Parts of a job are laid out
// along the grid's y axis (n_tiles_end: cumulative weight-row tiles), activation-row tiles along x.
struct MmaPart {
  DevMatrix w, w2;  // w2: the up projection of a dual job
  const float* x = nullptr;
  int64_t xs = 0;
  float* out = nullptr;
  int64_t os = 0;
  int n_tiles_end = 0;
  int rows = 0;          // plain part: activation rows 0..rows-1, written to the same rows of out
  bool grouped = false;  // rows from the job's expert lists; w/w2 are stacked experts
  int list_div = 1;      // grouped: list entry v reads activation row v / list_div and writes out row v
};
struct MmaJob {
  MmaPart part[kMmaMaxParts];
  int parts = 0;
  int tile_cols = kMmaCols;  // weight rows per tile, for every part: mma_tile_cols of part 0
  bool dual = false;         // out = silu(x . W^T) * (x . W2^T)
  bool accumulate = false;   // out = out + x . W^T (not dual)
  // Expert lists of grouped parts (moe_partition.h): entries of expert e are list[e * list_stride + i],
  // i < count[e]; its row tiles are [tile_start[e], tile_start[e + 1]).
  const int* list = nullptr;
  int64_t list_stride = 0;
  const int* count = nullptr;
  const int* tile_start = nullptr;
  int experts = 0;
};
// Weight rows per tile of a product over w (and w2, the up projection of a gate/up pair): bf16 matrices of at
// least 4 wide tiles take wide tiles, which read fewer shared-memory bytes per mma (a smaller one, like the
// router, would leave too few blocks); each output keeps its sum and order either way (PD_MMA_WIDE=0: never,
// for same-run comparisons).
inline int mma_tile_cols(const DevMatrix& w, const DevMatrix* w2) {
  static const bool wide = env_switch_on("PD_MMA_WIDE");
  const bool bf16 = w.fmt == WFmt::kBF16 && (w2 == nullptr || w2->fmt == WFmt::kBF16);
  const int64_t rows = w2 == nullptr ? w.rows : 2 * w.rows;
  return wide && bf16 && rows >= 4 * kMmaColsWide ? kMmaColsWide : kMmaCols;
}
// m_tiles: the grid's x extent (the most row tiles any part can have; blocks past a part's tiles exit).
// Every part of a job has the weight format of part[0] (dual: w and w2 may differ from each other).
void launch_mma(const MmaJob& j, int m_tiles, cudaStream_t stream);
// Opts the kernels into the shared memory they need; called once by the backend.
void init_mma_kernels();
// The same products on Hopper's wgmma fed by the tensor memory accelerator (gemm_tma.cu), for jobs of bf16
// matrices: plain parts on one activation input, or (at most two parts) grouped experts and gate/up pairs;
// and jobs of affine matrices of one width of 2, 4, 6 or 8 bits (gemm_tma_affine.cu; PD_AFFINE_TMA=0 leaves
// them to mma.sync). On wherever the build has sm_90a code and the device is compute capability 9.0
// (PD_MMA_TMA=0: mma.sync everywhere; docs/DESIGN.md §8). The choice depends on the matrices alone, so a
// matrix's prefill rows always come from one kernel (chunking invariance). Precision and order as above
// (hi*w, then lo*w, per k16 step; affine codes grouped as above): the results agree with launch_mma's to
// rounding, not bitwise. m_tiles as for launch_mma; scratch: mma_tma_scratch_bytes, for the activations' bf16
// hi and lo copies (a grouped part's gathered into its row tiles).
bool mma_tma_available();
bool mma_tma_takes(const MmaJob& j);
int64_t mma_tma_scratch_bytes(const MmaJob& j, int m_tiles);
// The most scratch a part of `rows` activation rows and K columns takes (a bound for carving scratch ahead).
int64_t mma_tma_part_bytes(int64_t rows, int64_t K);
void launch_mma_tma(const MmaJob& j, int m_tiles, void* scratch, cudaStream_t stream);

// ---- Dense ops (ops_dense.cu) ----
void launch_gemv(const DevMatrix& w, const float* x, int64_t x_stride, float* out, int64_t out_stride,
                 int rows, bool accumulate, cudaStream_t stream);
// Several matrices of one format and width applied to the same rows in one launch (rows <= kMaxRows): output
// row n of the concatenation belongs to matrix i when end[i-1] <= n < end[i]; each product is computed
// bitwise as launch_gemv computes it.
constexpr int kMaxMulti = 4;
struct GemvMulti {
  DevMatrix m[kMaxMulti];
  float* out[kMaxMulti] = {};
  int64_t os[kMaxMulti] = {};
  int64_t end[kMaxMulti] = {};
  int count = 0;
};
void launch_gemv_multi(const GemvMulti& g, const float* x, int64_t x_stride, int rows, cudaStream_t stream);
// Whether launch_gemv_multi runs all of g's matrices as one streamed launch (gemv_stream.cu), which can take
// an input norm: launch_gemv_multi_normed multiplies rms_norm(x) (norm: its weight, 16-byte aligned; eps)
// bit for bit as launch_rms_norm followed by launch_gemv_multi would.
bool gemv_multi_streams(const GemvMulti& g);
void launch_gemv_multi_normed(const GemvMulti& g, const float* x, int64_t x_stride, int rows,
                              const float* norm, float eps, cudaStream_t stream);
void launch_embed(const DevMatrix& table, const int32_t* tokens, int64_t token_stride, float* out,
                  int64_t out_stride, int rows, cudaStream_t stream);
void launch_rms_norm(const float* x, int64_t x_stride, const float* weight, int n, float eps, float* out,
                     int64_t out_stride, int rows, cudaStream_t stream);
void launch_add(const float* a, int64_t a_stride, const float* b, int64_t b_stride, float* out,
                int64_t out_stride, int rows, int n, cudaStream_t stream);
void launch_argmax(const float* x, int64_t x_stride, int n, int32_t* out, int64_t out_stride, int rows,
                   cudaStream_t stream);
// The same over many blocks per row (wide rows such as logits); scratch: 8 * rows * argmax_slices(n) bytes.
int argmax_slices(int n);
void launch_argmax_wide(const float* x, int64_t x_stride, int n, int32_t* out, int64_t out_stride, int rows,
                        void* scratch, cudaStream_t stream);

// ---- Gated attention (attention.cu) ----
struct AttentionLaunch {
  int num_heads = 0, num_kv_heads = 0, head_dim = 0, rotary_dim = 0;
  float rope_theta = 0.0f, eps = 0.0f;
  const float* qg = nullptr;
  int64_t qg_stride = 0;
  const float* k = nullptr;
  int64_t k_stride = 0;
  const float* v = nullptr;
  int64_t v_stride = 0;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  const int32_t* positions = nullptr;
  int64_t position_stride = 0;
  void* cache_k = nullptr;  // [T, Hkv * D]
  void* cache_v = nullptr;
  bool cache_bf16 = true;
  int64_t capacity = 0;  // T
  float* out = nullptr;
  int64_t out_stride = 0;
  int rows = 0;
  bool prefill = false;           // a prefill piece: the flash kernel whatever rows (when it supports a)
  size_t smem_limit = 48 * 1024;  // dynamic shared memory a block may use (set_attention_smem_limit)
  int multiprocessors = 0;        // of the device: sizes the decode grid
  // Scratch (attention_scratch_floats): normalised queries and the split-K partial results.
  float* scratch = nullptr;
};
// Scratch floats launch_attention needs for a (everything but the scratch pointer filled in).
int64_t attention_scratch_floats(const AttentionLaunch& a);
// The opt-in above 48 KiB of dynamic shared memory that the tensor-core kernels need (set once by the
// backend to the device's limit, which it passes as smem_limit).
void set_attention_smem_limit(size_t bytes);
void launch_attention(const AttentionLaunch& a, cudaStream_t stream);

// ---- Gated DeltaNet (gated_delta_net.cu, gdn_recurrent.cu) ----
struct GdnLaunch {
  int num_k_heads = 0, num_v_heads = 0, k_head_dim = 0, v_head_dim = 0, conv_kernel = 0;
  float eps = 0.0f;
  const float* qkv = nullptr;
  int64_t qkv_stride = 0;
  const float* z = nullptr;
  int64_t z_stride = 0;
  const float* b = nullptr;
  int64_t b_stride = 0;
  const float* a = nullptr;
  int64_t a_stride = 0;
  const float* conv1d = nullptr;   // [C * Kc]
  const float* A_log = nullptr;    // [Hv]
  const float* dt_bias = nullptr;  // [Hv]
  const float* norm = nullptr;     // [Dv]
  float* conv_state = nullptr;     // [Kc - 1, C]
  float* recurrent = nullptr;      // [Hv, Dk * Dv]
  float* snap_conv = nullptr;      // [R_max, (Kc - 1) * C] or null
  int64_t snap_conv_stride = 0;
  float* snap_recurrent = nullptr;  // [R_max, Hv * Dk * Dv] or null
  int64_t snap_recurrent_stride = 0;
  float* out = nullptr;
  int64_t out_stride = 0;
  int rows = 0;
  float* scratch = nullptr;  // the prefill kernels' gdn_prefill_scratch_floats (the decode step takes none)
  // Prefill (gdn_prefill.cu): the absolute position of row 0 modulo kGdnPrefillChunk, and the scratch layout
  // (gdn_prefill_caps).
  int chunk_offset = 0;
  int seg_rows_cap = 0, seg_chunks_cap = 0;
};
constexpr int kGdnChunk = 64;  // rows per decode step launch (bounds the shared memory per row)
// Dims both GDN paths take (the step's cluster holds the blocks of every value head of a key head: a GQA
// ratio of at most 8).
bool gdn_supported(int k_head_dim, int v_head_dim, int num_k_heads, int num_v_heads);
void launch_gated_delta_net(const GdnLaunch& g, cudaStream_t stream);
// The conv, recurrence and gated norm of rows [r0, r0 + rows) (rows <= kGdnChunk), in one launch.
void launch_gdn_step(const GdnLaunch& g, int r0, int rows, cudaStream_t stream);

// ---- Gated DeltaNet prefill: the chunked form over position-aligned chunks (gdn_prefill.cu) ----
constexpr int kGdnPrefillChunk = 64;   // positions per chunk (backend.h kGdnPrefillChunk)
constexpr int kGdnSegmentChunks = 16;  // chunks per pass of the three chunk kernels (bounds the scratch)
struct GdnPrefillCaps {
  int rows = 0;    // rows of one segment's per-row scratch
  int chunks = 0;  // chunks of one segment
};
// The scratch a step of `rows` rows needs: one segment of at most kGdnSegmentChunks chunks at a time.
GdnPrefillCaps gdn_prefill_caps(int rows);
int64_t gdn_prefill_scratch_floats(int channels, int num_v_heads, int k_head_dim, int v_head_dim, int rows);
// Dynamic shared memory the prefill kernels need (the largest of them); set_gdn_prefill_smem_limit() opts
// them in to `bytes` (the device's limit, set once by the backend).
size_t gdn_prefill_smem_bytes(int k_head_dim, int v_head_dim);
void set_gdn_prefill_smem_limit(size_t bytes);
// Dims as gdn_supported(); g.chunk_offset, g.seg_*_cap and g.scratch set for the prefill.
void launch_gated_delta_net_prefill(const GdnLaunch& g, cudaStream_t stream);

// ---- Sparse MoE block (moe.cu) ----
struct MoeLaunch {
  DevMatrix router;       // [E, H]
  DevMatrix shared_gate;  // [1, H] (shared_expert_gate)
  DevMatrix gate, up;     // stacked experts [E][I, H]
  DevMatrix down;         // stacked experts [E][H, I]
  DevMatrix sh_gate, sh_up, sh_down;
  int experts = 0, top_k = 0, hidden = 0, inter = 0, shared_inter = 0;
  bool norm_topk = true;
  bool router_gate_fused = false;  // router and shared gate share format and width: one launch
  // The shared expert's gate/up or down is not in the format of the routed experts' gate/up or down: its
  // products then run in launches of their own.
  bool shared_format_differs = false;
  const float* x = nullptr;
  int64_t x_stride = 0;
  float* out = nullptr;
  int64_t out_stride = 0;
  bool accumulate = false;  // out = out + block output
  int rows = 0;
  void* scratch = nullptr;  // moe_scratch_bytes
  // Two counters, zero between launches, not in the scratch (which the wide path lays out differently):
  // [0] the router blocks finished (moe.cu; the last resets it); [1] moe_stream_up.cu's grid barrier.
  int* router_ticket = nullptr;
  // When set, the number of distinct experts each decode chunk reads is added to it (bytes accounting).
  unsigned long long* experts_read = nullptr;
};
int64_t moe_scratch_bytes(int experts, int top_k, int hidden, int inter, int shared_inter);
// Decode steps (chunks of kMaxRows rows); steps wider than kMaxRows run the tiled reference path.
void launch_moe(const MoeLaunch& m, cudaStream_t stream);
// The tiled reference path (moe_wide.cu), for any number of rows; moe_scratch_bytes covers its scratch.
int64_t moe_wide_scratch_bytes(int experts, int top_k, int hidden, int inter, int shared_inter);
void launch_moe_wide(const MoeLaunch& m, cudaStream_t stream);
// Prefill (moe_grouped.cu): the block as grouped tensor-core products over every row of the step at once;
// scratch: moe_grouped_scratch_bytes for m.rows rows.
int64_t moe_grouped_scratch_bytes(int rows, int experts, int top_k, int hidden, int inter, int shared_inter);
void launch_moe_grouped(const MoeLaunch& m, cudaStream_t stream);
// The pieces of the block both paths share (moe.cu): routing of `rows` rows from their router logits
// [rows, E] into sel/wts [rows, K] (ascending expert id), and the combine
// out[r] (=|+=) ((0 + w_1 y_1) + w_2 y_2 ...) + sigmoid(sg[r]) * ys[r] over y [rows * K, H] and ys [rows, H].
void launch_moe_route_rows(const MoeLaunch& m, int rows, const float* logits, int* sel, float* wts,
                           cudaStream_t stream);
void launch_moe_combine(const MoeLaunch& m, int rows, const float* y, const float* wts, const float* sg,
                        const float* ys, cudaStream_t stream);
// The counting sort of a step's (row, slot) pairs by expert (moe_grouped.cu; host reference in
// moe_partition.h): list [E, rows], count [E], tile_start [E + 1] from sel [rows, K].
void launch_moe_partition(const int* sel, int rows, int top_k, int experts, int* list, int* count,
                          int* tile_start, cudaStream_t stream);
// The same with the device time of its phases added to ms (router products + route, gate/up, down + combine);
// synchronises (profiling only).
constexpr int kMoePhases = 3;
void launch_moe_profiled(const MoeLaunch& m, cudaStream_t stream, double ms[kMoePhases]);

// ---- Synthetic weights (synth.cu; formulas in synth_rng.h) ----
void launch_synth_dense(void* dst, WFmt fmt, int64_t count, uint64_t seed, float amplitude,
                        cudaStream_t stream);
void launch_synth_words(uint32_t* dst, int64_t count, uint64_t seed, cudaStream_t stream);
void launch_fill_scalar(void* dst, SDType dtype, int64_t count, float value, cudaStream_t stream);

}  // namespace pd::cuda
