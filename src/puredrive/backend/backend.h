// Backend: the op interface that architecture code (model/) calls. A backend owns device memory, the bound
// weights and every op kernel; model code only names ops and never branches on the device.
//
// Contracts every backend keeps (docs/DESIGN.md §4):
// - Row-exact: an op over R rows produces, for each row, bitwise the result of R one-row calls. Every
//   reduction runs in an order that depends only on the row's own data and position, never on R, on the
//   thread count or on other rows (no R-dependent split-K, tiling or kernel choice).
// - Asynchronous: ops may be queued (CUDA stream); nothing inside a step waits for the host. Only download()
//   and synchronize() block.
// - Activations are f32. Weights stay in their stored format (f32/f16/bf16/MLX affine) and are dequantised on
//   the fly with f32 accumulation. KV caches are bf16 or f32; GDN states are f32.
//
// Shape letters, one glossary for the whole project: R rows of this step, H hidden, V vocab, Hq/Hkv attention
// heads, D head dim, Hk/Hv GDN key/value heads, Dk/Dv GDN head dims, C conv channels (2*Hk*Dk + Hv*Dv), Kc
// conv kernel, E experts, I expert width, T context capacity.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "puredrive/checkpoint/weights.h"
#include "puredrive/util/dtype.h"
#include "puredrive/util/status.h"

namespace pd {

enum class Device { kCpu, kCuda };

// Whether an op overwrites its output or adds into it (out += result, rounded once per element).
enum class Accum { kOverwrite, kAdd };

// A non-owning, copyable view of a 2-D row-major array in a backend's memory: element (r, c) is at
// data + (r * stride + c) * dtype_size(dtype). Vectors are [1, n]; per-row scalars (token ids, positions)
// are [R, 1].
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;  // elements between the starts of consecutive rows, >= cols
  Device device = Device::kCpu;

  bool empty() const { return data == nullptr; }
  bool contiguous() const { return stride == cols; }
  int64_t numel() const { return rows * cols; }
  int64_t nbytes() const { return numel() * static_cast<int64_t>(dtype_size(dtype)); }

  Tensor row_slice(int64_t begin, int64_t count) const {
    Tensor t = *this;
    t.data = static_cast<uint8_t*>(data) + begin * stride * static_cast<int64_t>(dtype_size(dtype));
    t.rows = count;
    return t;
  }
  Tensor col_slice(int64_t begin, int64_t count) const {
    Tensor t = *this;
    t.data = static_cast<uint8_t*>(data) + begin * static_cast<int64_t>(dtype_size(dtype));
    t.cols = count;
    return t;
  }
  // A contiguous tensor seen with another row length (rows * cols must be preserved).
  Tensor reshaped(int64_t new_rows, int64_t new_cols) const {
    Tensor t = *this;
    t.rows = new_rows;
    t.cols = new_cols;
    t.stride = new_cols;
    return t;
  }
  // Host pointer to row r. Valid only for Device::kCpu.
  template <typename T>
  T* row(int64_t r) const {
    return reinterpret_cast<T*>(static_cast<uint8_t*>(data) + r * stride * static_cast<int64_t>(sizeof(T)));
  }
};

// Owning backend memory. Movable; the memory is released (by the backend's deleter) with the last copy.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Tensor tensor, std::shared_ptr<void> storage) : tensor_(tensor), storage_(std::move(storage)) {}
  const Tensor& tensor() const { return tensor_; }
  Tensor row_slice(int64_t begin, int64_t count) const { return tensor_.row_slice(begin, count); }
  bool empty() const { return tensor_.empty(); }
  int64_t nbytes() const { return tensor_.nbytes(); }

 private:
  Tensor tensor_;
  std::shared_ptr<void> storage_;
};

// Handles to weights bound once to a backend (the CPU backend keeps views into the mapped checkpoint; CUDA
// uploads). A handle is valid for the lifetime of the backend that returned it.
struct MatrixId {
  int32_t index = -1;
  bool valid() const { return index >= 0; }
};
struct VectorId {
  int32_t index = -1;
  bool valid() const { return index >= 0; }
};
struct MoeId {
  int32_t index = -1;
  bool valid() const { return index >= 0; }
};

// The host-side weights of one MoE block (spec §6), as a backend binds them with bind_moe(): a router,
// routed experts and one gated shared expert.
struct MoeWeights {
  Matrix gate;                    // router [E, H]
  std::vector<Matrix> gate_proj;  // per expert [I, H]
  std::vector<Matrix> up_proj;    // per expert [I, H]
  std::vector<Matrix> down_proj;  // per expert [H, I]
  Matrix shared_gate_proj;        // [Is, H]
  Matrix shared_up_proj;          // [Is, H]
  Matrix shared_down_proj;        // [H, Is]
  Matrix shared_expert_gate;      // [1, H]
};

// Routing parameters bound with an MoE block (spec §6).
struct MoeSpec {
  int num_experts_per_tok = 0;
  bool norm_topk_prob = true;
};

// ---- Op arguments. Every op validates shapes and returns kInvalidArgument naming the argument. ----

// out[r] = table[tokens[r]] dequantised.
struct EmbedArgs {
  MatrixId table;  // [V, H]
  Tensor tokens;   // I32 [R, 1]
  Tensor out;      // F32 [R, H]
};

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight (zero-centred weights come with the +1 folded in).
// out may alias x.
struct RmsNormArgs {
  Tensor x;         // F32 [R, N]
  VectorId weight;  // [N]
  float eps = 1e-6f;
  Tensor out;  // F32 [R, N]
};

// out = a + b elementwise; out may alias a or b.
struct AddArgs {
  Tensor a;    // F32 [R, N]
  Tensor b;    // F32 [R, N]
  Tensor out;  // F32 [R, N]
};

// prefill (MatmulArgs, MatmulsArgs, MoeArgs): the op is part of a prompt's prefill. A backend may then run
// its prefill kernels whatever R (docs/DESIGN.md §4.1), which keep the row contract among themselves: a
// row's result does not depend on R or on the row's place in the step, so a prompt split into chunks at any
// points gives the same bits (§4.6); they need not equal the decode kernels' bits.

// out[r, n] (=|+=) sum_k x[r, k] * W[n, k], f32 accumulation in an order independent of R.
struct MatmulArgs {
  MatrixId w;  // [N, K], any format
  Tensor x;    // F32 [R, K]
  Tensor out;  // F32 [R, N]
  Accum accum = Accum::kOverwrite;
  bool prefill = false;
};

// An RMSNorm of an op's input rows, applied before the op reads them (MatmulsArgs, MoeArgs: the decoder
// layer's two norms). The op computes on rms_norm(x, weight, eps) bit for bit as a separate rms_norm() into
// `scratch` would give; a backend may fuse it into the op's kernels and leave scratch unwritten.
// weight invalid: no norm. scratch: F32 [R, K], aliasing neither x nor the op's outputs; its contents
// afterwards are unspecified.
struct InputNorm {
  VectorId weight;
  float eps = 1e-6f;
  Tensor scratch;
  bool active() const { return weight.valid(); }
};

// Products of one input with several matrices (a mixer's input projections), which a backend may run as one
// launch: targets[i].out = x . targets[i].w^T, each bitwise as matmul() computes it (of the normalised x
// with norm).
struct MatmulTarget {
  MatrixId w;  // [N_i, K]
  Tensor out;  // F32 [R, N_i]
};
struct MatmulsArgs {
  Tensor x;  // F32 [R, K]
  std::span<const MatmulTarget> targets;
  InputNorm norm{};
  bool prefill = false;
};

struct AttentionDims {
  int num_heads = 0;     // Hq
  int num_kv_heads = 0;  // Hkv; query head h reads KV head h / (Hq / Hkv)
  int head_dim = 0;      // D
  int rotary_dim = 0;    // leading dims of each head rotated NeoX-style (pairs i, i + rotary_dim/2)
  double rope_theta = 10000.0;
  float eps = 1e-6f;  // q/k RMSNorm eps
};

// One full-attention layer's KV cache: row t holds the entry of position t.
struct KvCache {
  Tensor k;  // BF16|F32 [T, Hkv * D], post-norm, post-RoPE
  Tensor v;  // BF16|F32 [T, Hkv * D]
};

// Gated attention after the projections (spec §4): split qg per head into query and gate, RMSNorm q and k
// per head, rotate the first rotary_dim dims at each row's position, write k and v at positions[r], then for
// each row causal GQA softmax attention over cache positions [0, positions[r]] (scale D^-1/2; entries
// written by earlier rows of the same step are visible), times sigmoid(gate). With a window W > 0 a row
// attends only the last W positions, [max(0, positions[r] - W + 1), positions[r]] (the MTP head's draft-side
// approximation, docs/DESIGN.md §4.8; the CPU backend implements it, the CUDA kernels do not yet).
// Callers guarantee that entries [0, positions[r]) hold this sequence's keys and values.
struct GatedAttentionArgs {
  AttentionDims dims;
  Tensor qg;         // F32 [R, Hq * 2D]: per head [query (D) | gate (D)]
  Tensor k;          // F32 [R, Hkv * D], before norm and RoPE
  Tensor v;          // F32 [R, Hkv * D]
  VectorId q_norm;   // [D]
  VectorId k_norm;   // [D]
  Tensor positions;  // I32 [R, 1]
  // Host-side copy of positions[R-1] + 1: the most cache entries any row reads. Lets a device backend size
  // its launch without reading positions back; 0 when unknown.
  int32_t kv_length = 0;
  KvCache cache;
  Tensor out;  // F32 [R, Hq * D]
  // A prefill piece: a backend may take its prefill kernels whatever R (chunking invariance, docs/DESIGN.md
  // §4.6).
  bool prefill = false;
  int32_t window = 0;  // > 0: attend only the last `window` positions
};

struct GdnDims {
  int num_k_heads = 0;  // Hk
  int num_v_heads = 0;  // Hv; value head j reads key head j / (Hv / Hk)
  int k_head_dim = 0;   // Dk
  int v_head_dim = 0;   // Dv
  int conv_kernel = 4;  // Kc
  float eps = 1e-6f;    // gated RMSNorm eps
};

// One GDN layer's recurrent state (spec §5.2, §5.7).
struct GdnState {
  Tensor conv;       // F32 [Kc - 1, C]: the last Kc-1 pre-conv inputs, oldest first
  Tensor recurrent;  // F32 [Hv, Dk * Dv]: S_h[i, j] at i * Dv + j
};

// Per-row snapshots of one GDN layer's state; row r of each tensor holds the state after row r.
struct GdnSnapshots {
  Tensor conv;       // F32 [R_max, (Kc - 1) * C]
  Tensor recurrent;  // F32 [R_max, Hv * Dk * Dv]
  bool empty() const { return conv.empty(); }
};

// Gated DeltaNet after the input projections (spec §5.2-5.8), rows processed in order: causal depthwise
// conv over q|k|v with the carried conv state, SiLU, split, l2norm q and k, q *= Dk^-1/2, beta = sigmoid(b),
// g = -exp(A_log) * softplus(a + dt_bias), then per value head in fp32: S *= exp(g); S += k (beta (v - S^T
// k))^T; o = S^T q; out = w * rmsnorm(o) * silu(z) per head. Updates state in place; when snapshots is not
// empty the state after every row r is also written to snapshot row r.
//
// Decode and verify steps (prefill false) run that recurrence token by token, which keeps them row-exact.
// Prefill steps (prefill true, no snapshots) run the chunked form of spec §5.7 over chunks of
// kGdnPrefillChunk positions aligned to absolute positions (chunk boundaries where position % 64 == 0, the
// first and last chunk of a step possibly partial): a prompt prefilled in pieces whose boundaries are
// multiples of 64 leaves bitwise the same states and outputs as one piece (docs/DESIGN.md §4.6). The result
// agrees with the recurrence within rounding, not bitwise.
constexpr int kGdnPrefillChunk = 64;
struct GatedDeltaNetArgs {
  GdnDims dims;
  Tensor qkv;        // F32 [R, C] in_proj_qkv output (pre-conv), q | k | v head-major
  Tensor z;          // F32 [R, Hv * Dv]
  Tensor b;          // F32 [R, Hv]
  Tensor a;          // F32 [R, Hv]
  VectorId conv1d;   // [C * Kc], tap Kc-1 multiplies the current token
  VectorId A_log;    // [Hv]
  VectorId dt_bias;  // [Hv]
  VectorId norm;     // [Dv]
  GdnState state;
  GdnSnapshots snapshots;
  Tensor out;            // F32 [R, Hv * Dv], input of out_proj
  bool prefill = false;  // the chunked form; requires empty snapshots
  int32_t position = 0;  // absolute position of row 0 (places the chunk boundaries when prefill)
};

// The whole sparse MoE block (spec §6): fp32 softmax router, top-k (ties to the lower expert id),
// renormalise when norm_topk_prob, SwiGLU experts; per row
// out = (((0 + w_e1 * E_e1(x)) + w_e2 * E_e2(x)) + ...) + sigmoid(x . w_sg) * SwiGLU_shared(x)
// with the selected experts summed in ascending expert id (HF's order).
// With Accum::kAdd the block output is added to out (out = out + moe, one rounding per element), which fuses
// the decoder layer's residual add.
// With norm, the block's input is rms_norm(x) (the post_attention_layernorm) and out may alias x: the block
// reads all of x before it writes out.
struct MoeArgs {
  MoeId moe;
  Tensor x;  // F32 [R, H], post_attention_layernorm output (its input with norm)
  InputNorm norm{};
  Tensor out;  // F32 [R, H]; must not alias x without norm
  Accum accum = Accum::kOverwrite;
  bool prefill = false;
};

// out[r] = the lowest index of the maximum of x[r] (NaN never wins).
struct ArgmaxArgs {
  Tensor x;    // F32 [R, N]
  Tensor out;  // I32 [R, 1]
};

// ---- Sampling and speculative acceptance (docs/spec/speculative.md §2, §4) ----
//
// sample() turns logits rows into tokens on the device: it processes each row (logit bias, penalties,
// temperature, min_p, top_k, top_p) and applies an acceptance rule, so that only a few ints leave the device.
// The math is defined once, by the CPU backend's reference (backend/cpu/sampling.h), and every backend gives
// the same bits for the same inputs.
//
// A call over R = k + 1 rows verifies the drafts d_1..d_k (drafts[prior .. prior + k)): row j is p_j, the
// target's distribution after d_1..d_j; the rule returns a (0 <= a <= k) accepted drafts and one more token
// y. With k = 0 it draws y from the one row: a plain decoding step, or a drafter drawing its next draft
// (write_draft stores y at drafts[prior] on the device for the verify call to read).
//
// The op never waits for the host and writes a fixed number of words; what changes from call to call (seed,
// position, uniforms, drafts, history) lives in device memory, so a step recorded with it can be replayed.
enum class SampleRule : int32_t { kGreedy = 0, kTokenwise = 1, kBlock = 2, kSeeded = 3 };

// How a logits row is processed (the rest of decode/sampling_params.h: logit bias and history are tensors).
struct SampleParams {
  float temperature = 1.0f;  // 0: greedy
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;

  bool greedy() const { return temperature == 0.0f; }
  bool penalised() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f;
  }
};

constexpr int kSampleMaxRows = 16;              // R <= 16: up to 15 drafts
constexpr int kSampleMaxLogprobs = 20;          // OpenAI's top_logprobs limit
constexpr int32_t kSampleMaxVocab = 1 << 20;    // the fixed-point sums of sampling_math.h
constexpr int32_t kHistoryPromptBit = 1 << 30;  // history[t]: output count | this bit for prompt tokens
constexpr int kSampleControlWords = 2 + kSampleMaxRows;
// Control block words (I64): the seed of the seeded noise; the absolute position of the token that row 0
// produces; then the uniforms of kTokenwise / kBlock as double bits: u[0..k) test the drafts, u[k] draws y.
constexpr int kControlSeed = 0;
constexpr int kControlPosition = 1;
constexpr int kControlUniforms = 2;

// The first word of the output, and what the next two words then hold.
enum class SampleStatus : int32_t {
  kOk = 0,
  kNonFinite = 1,        // a logit is NaN or +inf (row, token); rows count target rows, then draft rows
  kAllMasked = 2,        // every logit of a row is -inf (row)
  kDraftNotInDraft = 3,  // q_j(d_j) = 0: d_j was not drawn from q_j (j - 1)
  kBadToken = 4,         // drafts[i] is outside the vocabulary (i, token)
};
// Output words (I32): [0] status, [1] and [2] its details, [3] a, [4 .. 4 + R) the tokens d_1..d_a, y (the
// rest -1), then with logprobs = n >= 0, per row j <= a: the logprob of token j (float bits) and n
// (id, logprob bits) pairs, most likely first, of the log_softmax of the raw logits row j. The first error
// in the order bad drafts, rows (target rows first, NaN before all-masked), acceptance is reported.
constexpr int kSampleOutStatus = 0;
constexpr int kSampleOutAccepted = 3;
constexpr int kSampleOutTokens = 4;
constexpr int64_t sample_out_words(int rows, int logprobs) {
  return kSampleOutTokens + rows + (logprobs >= 0 ? int64_t{rows} * (1 + 2 * logprobs) : 0);
}

struct SampleArgs {
  SampleRule rule = SampleRule::kGreedy;
  int32_t faulty = 0;   // deliberately wrong variants for tests (decode/acceptance.h testonly); 0: none
  SampleParams target;  // processes logits
  SampleParams draft;   // processes draft_logits
  Tensor logits;        // F32 [R, V]
  Tensor draft_logits;  // F32 [k, V]: q_1..q_k, the rows the drafts were drawn from (kTokenwise, kBlock)
  Tensor drafts;        // I32 [1, >= prior + k]; may be empty when prior + k == 0 and !write_draft
  int32_t prior = 0;    // drafts of this cycle before row 0: they count in every row's penalties
  bool write_draft = false;
  Tensor bias;            // F32 [1, V] logit bias, 0 = none; or empty
  Tensor history;         // I32 [1, V] output counts | kHistoryPromptBit; needed when the params penalise
  bool commit = false;    // add the emitted tokens to history (it then holds the next step's history)
  Tensor control;         // I64 [1, kSampleControlWords]
  int32_t logprobs = -1;  // -1: none; 0..kSampleMaxLogprobs
  Tensor out;             // I32 [1, sample_out_words(R, logprobs)]
};

// One region of copy_many(): `bytes` bytes from byte `src_offset` of src to byte `dst_offset` of dst,
// whatever the tensors' dtypes. Each tensor is a dense view (one row, or rows without gaps) in the backend's
// memory or, on a device backend, in host memory (Device::kCpu; the prefix cache's host tier).
struct CopyRegion {
  Tensor dst;
  int64_t dst_offset = 0;
  Tensor src;
  int64_t src_offset = 0;
  int64_t bytes = 0;
};

struct BackendOptions {
  std::string name = "cpu";  // "cpu" | "cuda" | "auto"
  int threads = 0;           // CPU worker threads, <= 0: all cores
  // CPU: jobs under this many multiply-adds run on the calling thread (0: always split; tests use it to
  // exercise the partition). Never changes results.
  int64_t min_parallel_work = 32768;
  int device_index = 0;  // CUDA device
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;

  // ---- Memory ----
  // Zero-initialised rows x cols array of dtype.
  virtual Expected<Buffer> alloc(DType dtype, int64_t rows, int64_t cols) = 0;
  // Host -> device; src holds dst.rows * dst.cols contiguous elements of dst.dtype.
  virtual Status upload(const Tensor& dst, const void* src) = 0;
  // Device -> host (waits for queued work); dst receives src.rows * src.cols contiguous elements.
  virtual Status download(void* dst, const Tensor& src) = 0;
  // Same shape and dtype; may not overlap.
  virtual Status copy(const Tensor& dst, const Tensor& src) = 0;
  virtual Status fill_zero(const Tensor& dst) = 0;
  // Every region of the list, as one operation whatever their number (CUDA: one kernel launch; the prefix
  // cache restores thousands of KV slices at once). No byte may be written by two regions or be written by
  // one and read by another. The list is validated before any byte moves: a region out of its tensors' bounds
  // is an error and nothing is copied. Host destinations hold their bytes when the call returns (it then
  // waits for the device, as download() does); inside a recorded step, the step runs eagerly from there on.
  virtual Status copy_many(std::span<const CopyRegion> regions) = 0;
  virtual Status synchronize() = 0;
  // Bytes the backend can still allocate (CPU: MemAvailable; CUDA: free device memory), for memory plans.
  virtual int64_t available_memory() const = 0;

  // ---- Step capture (optional) ----
  // The ops between begin_step() and end_step() form one step that a backend may record and replay (CUDA: one
  // graph per distinct sequence of op arguments, captured once). Inside a step, upload() copies its host data
  // at the call, and download()/synchronize() first run what was recorded. Calls nest; the outermost pair
  // counts. Backends that run ops immediately (CPU) need not override these.
  virtual Status begin_step() { return Status::ok(); }
  virtual Status end_step() { return Status::ok(); }

  // ---- Weights, bound once ----
  virtual Expected<MatrixId> bind_matrix(const Matrix& m) = 0;
  virtual Expected<VectorId> bind_vector(std::span<const float> v, const std::string& name) = 0;
  virtual Expected<MoeId> bind_moe(const MoeWeights& w, const MoeSpec& spec) = 0;
  // Bytes of weights the backend holds or references (for the memory plan and reports).
  virtual int64_t bound_bytes() const = 0;

  // ---- Ops ----
  virtual Status embed(const EmbedArgs& args) = 0;
  virtual Status rms_norm(const RmsNormArgs& args) = 0;
  virtual Status add(const AddArgs& args) = 0;
  virtual Status matmul(const MatmulArgs& args) = 0;
  virtual Status matmuls(const MatmulsArgs& args) {
    PD_ASSIGN_OR_RETURN(const Tensor x, normalized_input("matmuls", args.x, args.norm));
    for (const MatmulTarget& t : args.targets) {
      PD_TRY(matmul({.w = t.w, .x = x, .out = t.out, .prefill = args.prefill}));
    }
    return Status::ok();
  }
  virtual Status gated_attention(const GatedAttentionArgs& args) = 0;
  virtual Status gated_delta_net(const GatedDeltaNetArgs& args) = 0;
  virtual Status moe(const MoeArgs& args) = 0;
  virtual Status argmax(const ArgmaxArgs& args) = 0;
  virtual Status sample(const SampleArgs& args) = 0;

 protected:
  // The rows an op with an input norm reads where the backend does not fuse it: x normalised into
  // norm.scratch by rms_norm() (which checks the scratch's shape); x itself without a norm.
  Expected<Tensor> normalized_input(const char* op, const Tensor& x, const InputNorm& norm) {
    if (!norm.active()) return x;
    if (norm.scratch.data == x.data) {
      return make_error(ErrorCode::kInvalidArgument, "{}: norm.scratch aliases x or out", op);
    }
    PD_TRY(rms_norm({.x = x, .weight = norm.weight, .eps = norm.eps, .out = norm.scratch}));
    return norm.scratch;
  }
};

// Creates the backend named in options ("cpu", or "cuda" when built with CUDA; "auto": CUDA when built with
// it and a device is usable, else the CPU). Unknown or unavailable names are an error that lists the
// available backends.
Expected<std::unique_ptr<Backend>> create_backend(const BackendOptions& options);

// Names of the backends compiled into this binary.
std::vector<std::string> available_backends();

}  // namespace pd
