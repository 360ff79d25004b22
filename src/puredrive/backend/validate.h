// Argument checks shared by the backends: every failure names the op, the argument, what was expected and
// what was found. A backend adds only what its kernels need beyond these (alignment, column multiples).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "puredrive/backend/backend.h"

namespace pd {

inline const char* device_name(Device d) {
  return d == Device::kCuda ? "CUDA" : "CPU";
}

// dtype, shape (-1: any) and a row stride of at least the width, in the memory of `device`.
inline Status check_tensor_on(Device device, const char* op, const char* arg, const Tensor& t, DType dtype,
                              int64_t rows, int64_t cols) {
  if (t.empty()) return make_error(ErrorCode::kInvalidArgument, "{}: {} is empty", op, arg);
  if (t.device != device) {
    return make_error(ErrorCode::kInvalidArgument, "{}: {} is not {} memory", op, arg, device_name(device));
  }
  if (t.dtype != dtype) {
    return make_error(ErrorCode::kInvalidArgument, "{}: {} has dtype {}, expected {}", op, arg,
                      dtype_name(t.dtype), dtype_name(dtype));
  }
  if ((rows >= 0 && t.rows != rows) || (cols >= 0 && t.cols != cols)) {
    return make_error(ErrorCode::kInvalidArgument, "{}: {} is [{}, {}], expected [{}, {}]", op, arg, t.rows,
                      t.cols, rows, cols);
  }
  if (t.stride < t.cols) {
    return make_error(ErrorCode::kInvalidArgument, "{}: {} has row stride {} < cols {}", op, arg, t.stride,
                      t.cols);
  }
  return Status::ok();
}

// A KV cache: F32 or BF16, contiguous rows of `cols` entries.
inline Status check_kv_layout(const char* op, const char* arg, const Tensor& t, int64_t cols) {
  if (t.empty()) return make_error(ErrorCode::kInvalidArgument, "{}: {} is empty", op, arg);
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16) {
    return make_error(ErrorCode::kInvalidArgument, "{}: {} has dtype {}, expected F32 or BF16", op, arg,
                      dtype_name(t.dtype));
  }
  if (t.cols != cols || !t.contiguous()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: {} is [{}, {}] (stride {}), expected contiguous [T, {}]", op, arg, t.rows, t.cols,
                      t.stride, cols);
  }
  return Status::ok();
}

// copy_many's regions (backend.h CopyRegion): each tensor in `device` memory or host memory, dense, each
// range inside its tensor; no byte written by two regions or written by one and read by another. Every
// failure names the region's index.
inline Status validate_copy_many(Device device, std::span<const CopyRegion> regions) {
  struct Range {
    uintptr_t begin, end;
    size_t region;
    bool write;
  };
  std::vector<Range> ranges;
  ranges.reserve(2 * regions.size());
  for (size_t i = 0; i < regions.size(); ++i) {
    const CopyRegion& r = regions[i];
    if (r.bytes < 0) {
      return make_error(ErrorCode::kInvalidArgument, "copy_many: region {} has {} bytes", i, r.bytes);
    }
    for (const bool dst : {true, false}) {
      const Tensor& t = dst ? r.dst : r.src;
      const int64_t offset = dst ? r.dst_offset : r.src_offset;
      const char* side = dst ? "destination" : "source";
      if (t.empty())
        return make_error(ErrorCode::kInvalidArgument, "copy_many: region {}'s {} is empty", i, side);
      if (t.device != device && t.device != Device::kCpu) {
        return make_error(ErrorCode::kInvalidArgument,
                          "copy_many: region {}'s {} is neither {} nor host memory", i, side,
                          device_name(device));
      }
      if (t.rows < 0 || t.cols < 0 || (t.rows > 1 && t.stride != t.cols)) {
        return make_error(ErrorCode::kInvalidArgument,
                          "copy_many: region {}'s {} is [{}, {}] with row stride {}, not dense", i, side,
                          t.rows, t.cols, t.stride);
      }
      const int64_t extent = t.nbytes();
      if (offset < 0 || offset > extent || r.bytes > extent - offset) {
        return make_error(ErrorCode::kInvalidArgument,
                          "copy_many: region {} {} bytes [{}, {}) of a {} of {} bytes", i,
                          dst ? "writes" : "reads", offset, offset + r.bytes, side, extent);
      }
      if (r.bytes > 0) {
        const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data) + static_cast<uintptr_t>(offset);
        ranges.push_back({begin, begin + static_cast<uintptr_t>(r.bytes), i, dst});
      }
    }
  }
  // In address order, a range overlaps an earlier one exactly when it begins before the furthest end so far.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  const Range* furthest = nullptr;        // of all ranges so far
  const Range* furthest_write = nullptr;  // of the destinations so far
  for (const Range& r : ranges) {
    const Range* hit = r.write ? furthest : furthest_write;
    if (hit != nullptr && r.begin < hit->end) {
      if (hit->region == r.region) {
        return make_error(ErrorCode::kInvalidArgument,
                          "copy_many: region {}'s source and destination overlap", r.region);
      }
      return make_error(ErrorCode::kInvalidArgument,
                        "copy_many: regions {} and {} overlap (a byte written twice, or written and read)",
                        std::min(hit->region, r.region), std::max(hit->region, r.region));
    }
    if (furthest == nullptr || r.end > furthest->end) furthest = &r;
    if (r.write && (furthest_write == nullptr || r.end > furthest_write->end)) furthest_write = &r;
  }
  return Status::ok();
}

inline Status check_matrix_shape(const char* op, const Matrix& m, int64_t rows, int64_t cols) {
  if ((rows >= 0 && m.rows != rows) || (cols >= 0 && m.cols != cols)) {
    return make_error(ErrorCode::kInvalidArgument, "{}: weight {} is [{}, {}], expected [{}, {}]", op, m.name,
                      m.rows, m.cols, rows, cols);
  }
  return Status::ok();
}

// A weight every backend can bind: not empty; affine with 2..8 bits, groups of 32, 64 or 128 dividing the
// columns, scales and biases in bf16/f16/f32.
inline Status validate_matrix(const Matrix& m) {
  if (m.empty() || m.rows <= 0 || m.cols <= 0) {
    return make_error(ErrorCode::kInvalidArgument, "bind_matrix: {} is empty ([{}, {}])", m.name, m.rows,
                      m.cols);
  }
  if (m.format != WeightFormat::kAffine) return Status::ok();
  if (m.bits < 2 || m.bits > 8) {
    return make_error(ErrorCode::kUnsupported, "bind_matrix: {} has {} bits, supported 2..8", m.name, m.bits);
  }
  // MLX's group sizes (as model_config accepts them): powers of two, which the CUDA kernels index by shifts.
  if ((m.group_size != 32 && m.group_size != 64 && m.group_size != 128) || m.cols % m.group_size != 0) {
    return make_error(
        ErrorCode::kUnsupported,
        "bind_matrix: {} has group size {} for {} columns; need 32, 64 or 128, dividing the columns", m.name,
        m.group_size, m.cols);
  }
  if (m.scales == nullptr || m.biases == nullptr) {
    return make_error(ErrorCode::kInvalidArgument, "bind_matrix: {} is affine but has no scales/biases",
                      m.name);
  }
  if (m.scale_dtype != DType::kBF16 && m.scale_dtype != DType::kF16 && m.scale_dtype != DType::kF32) {
    return make_error(ErrorCode::kUnsupported, "bind_matrix: {} has scales of dtype {}", m.name,
                      dtype_name(m.scale_dtype));
  }
  return Status::ok();
}

// An MoE block's weights (backend.h MoeWeights): matching expert counts, every matrix accepted by
// validate_one (the backend's matrix check) and shaped by the router's width and the experts' widths.
inline Status validate_moe(const MoeWeights& w, const MoeSpec& spec, Status (*validate_one)(const Matrix&)) {
  const size_t num_experts = w.gate_proj.size();
  if (num_experts == 0 || w.up_proj.size() != num_experts || w.down_proj.size() != num_experts) {
    return make_error(ErrorCode::kInvalidArgument, "bind_moe: {} gate, {} up and {} down expert matrices",
                      w.gate_proj.size(), w.up_proj.size(), w.down_proj.size());
  }
  const int64_t hidden = w.gate.cols;
  const int64_t inter = w.gate_proj[0].rows;
  PD_TRY(validate_one(w.gate));
  PD_TRY(check_matrix_shape("bind_moe", w.gate, static_cast<int64_t>(num_experts), hidden));
  if (spec.num_experts_per_tok <= 0 || spec.num_experts_per_tok > static_cast<int>(num_experts)) {
    return make_error(ErrorCode::kInvalidArgument, "bind_moe: num_experts_per_tok {} with {} experts",
                      spec.num_experts_per_tok, num_experts);
  }
  for (size_t e = 0; e < num_experts; ++e) {
    PD_TRY(validate_one(w.gate_proj[e]));
    PD_TRY(validate_one(w.up_proj[e]));
    PD_TRY(validate_one(w.down_proj[e]));
    PD_TRY(check_matrix_shape("bind_moe", w.gate_proj[e], inter, hidden));
    PD_TRY(check_matrix_shape("bind_moe", w.up_proj[e], inter, hidden));
    PD_TRY(check_matrix_shape("bind_moe", w.down_proj[e], hidden, inter));
  }
  const int64_t shared = w.shared_gate_proj.rows;
  for (const Matrix* m :
       {&w.shared_gate_proj, &w.shared_up_proj, &w.shared_down_proj, &w.shared_expert_gate}) {
    PD_TRY(validate_one(*m));
  }
  PD_TRY(check_matrix_shape("bind_moe", w.shared_gate_proj, shared, hidden));
  PD_TRY(check_matrix_shape("bind_moe", w.shared_up_proj, shared, hidden));
  PD_TRY(check_matrix_shape("bind_moe", w.shared_down_proj, hidden, shared));
  return check_matrix_shape("bind_moe", w.shared_expert_gate, 1, hidden);
}

// gated_delta_net's arguments (backend.h GatedDeltaNetArgs): dims, every tensor's shape in `device` memory,
// contiguous states, snapshots wide enough for the step, and a prefill step without snapshots.
inline Status validate_gated_delta_net(Device device, const GatedDeltaNetArgs& a) {
  const char* op = "gated_delta_net";
  const GdnDims& d = a.dims;
  if (d.num_k_heads <= 0 || d.num_v_heads <= 0 || d.num_v_heads % d.num_k_heads != 0 || d.k_head_dim <= 0 ||
      d.v_head_dim <= 0 || d.conv_kernel < 1) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: bad dims (k heads {}, v heads {}, k dim {}, v dim {}, kernel {})", op,
                      d.num_k_heads, d.num_v_heads, d.k_head_dim, d.v_head_dim, d.conv_kernel);
  }
  const int64_t rows = a.qkv.rows;
  const int64_t value_dim = int64_t{d.num_v_heads} * d.v_head_dim;
  const int64_t channels = 2 * int64_t{d.num_k_heads} * d.k_head_dim + value_dim;
  const int64_t state_size = value_dim * d.k_head_dim;
  PD_TRY(check_tensor_on(device, op, "qkv", a.qkv, DType::kF32, -1, channels));
  PD_TRY(check_tensor_on(device, op, "z", a.z, DType::kF32, rows, value_dim));
  PD_TRY(check_tensor_on(device, op, "b", a.b, DType::kF32, rows, d.num_v_heads));
  PD_TRY(check_tensor_on(device, op, "a", a.a, DType::kF32, rows, d.num_v_heads));
  PD_TRY(check_tensor_on(device, op, "out", a.out, DType::kF32, rows, value_dim));
  PD_TRY(check_tensor_on(device, op, "state.conv", a.state.conv, DType::kF32, d.conv_kernel - 1, channels));
  PD_TRY(check_tensor_on(device, op, "state.recurrent", a.state.recurrent, DType::kF32, d.num_v_heads,
                         int64_t{d.k_head_dim} * d.v_head_dim));
  if (!a.state.conv.contiguous() || !a.state.recurrent.contiguous()) {
    return make_error(ErrorCode::kInvalidArgument, "{}: state tensors must be contiguous", op);
  }
  if (a.prefill && !a.snapshots.empty()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: a prefill step keeps no per-row snapshots (they need the recurrence)", op);
  }
  if (a.position < 0) return make_error(ErrorCode::kInvalidArgument, "{}: position {} < 0", op, a.position);
  if (!a.snapshots.empty()) {
    PD_TRY(check_tensor_on(device, op, "snapshots.conv", a.snapshots.conv, DType::kF32, -1,
                           (d.conv_kernel - 1) * channels));
    PD_TRY(check_tensor_on(device, op, "snapshots.recurrent", a.snapshots.recurrent, DType::kF32,
                           a.snapshots.conv.rows, state_size));
    if (a.snapshots.conv.rows < rows) {
      return make_error(ErrorCode::kInvalidArgument, "{}: {} snapshot rows for a step of {} rows", op,
                        a.snapshots.conv.rows, rows);
    }
  }
  return Status::ok();
}

// ---- The ops' arguments (backend.h *Args) in `device` memory, once the backend has resolved the handles
// they name (the sizes passed in). A backend adds what its own kernels need after these.

inline Status validate_alloc(int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) {
    return make_error(ErrorCode::kInvalidArgument, "alloc: negative shape [{}, {}]", rows, cols);
  }
  return Status::ok();
}

inline Status validate_copy(const Tensor& dst, const Tensor& src) {
  if (dst.dtype != src.dtype || dst.rows != src.rows || dst.cols != src.cols) {
    return make_error(ErrorCode::kInvalidArgument, "copy: [{}, {}] {} into [{}, {}] {}", src.rows, src.cols,
                      dtype_name(src.dtype), dst.rows, dst.cols, dtype_name(dst.dtype));
  }
  return Status::ok();
}

// width: the table's columns.
inline Status validate_embed(Device device, const EmbedArgs& a, int64_t width) {
  PD_TRY(check_tensor_on(device, "embed", "tokens", a.tokens, DType::kI32, -1, 1));
  return check_tensor_on(device, "embed", "out", a.out, DType::kF32, a.tokens.rows, width);
}

// n: the weight's size.
inline Status validate_rms_norm(Device device, const RmsNormArgs& a, int64_t n) {
  PD_TRY(check_tensor_on(device, "rms_norm", "x", a.x, DType::kF32, -1, n));
  return check_tensor_on(device, "rms_norm", "out", a.out, DType::kF32, a.x.rows, n);
}

inline Status validate_add(Device device, const AddArgs& a) {
  PD_TRY(check_tensor_on(device, "add", "a", a.a, DType::kF32, -1, -1));
  PD_TRY(check_tensor_on(device, "add", "b", a.b, DType::kF32, a.a.rows, a.a.cols));
  return check_tensor_on(device, "add", "out", a.out, DType::kF32, a.a.rows, a.a.cols);
}

// x [R, w.cols] . w^T into out [R, w.rows] (matmul, and each target of matmuls).
inline Status validate_product(Device device, const char* op, const Tensor& x, const Tensor& out,
                               int64_t w_rows, int64_t w_cols) {
  PD_TRY(check_tensor_on(device, op, "x", x, DType::kF32, -1, w_cols));
  return check_tensor_on(device, op, "out", out, DType::kF32, x.rows, w_rows);
}

// Dims, tensor shapes, and KV caches of one shape and dtype in `device` memory. Not the positions' values,
// which are in device memory on a GPU.
inline Status validate_gated_attention(Device device, const GatedAttentionArgs& a) {
  const char* op = "gated_attention";
  const AttentionDims& d = a.dims;
  if (d.num_heads <= 0 || d.num_kv_heads <= 0 || d.num_heads % d.num_kv_heads != 0 || d.head_dim <= 0 ||
      d.rotary_dim < 0 || d.rotary_dim > d.head_dim || d.rotary_dim % 2 != 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: bad dims (heads {}, kv heads {}, head dim {}, rotary dim {})", op, d.num_heads,
                      d.num_kv_heads, d.head_dim, d.rotary_dim);
  }
  const int64_t rows = a.qg.rows;
  const int64_t q_width = int64_t{d.num_heads} * d.head_dim;
  const int64_t kv_width = int64_t{d.num_kv_heads} * d.head_dim;
  PD_TRY(check_tensor_on(device, op, "qg", a.qg, DType::kF32, -1, 2 * q_width));
  PD_TRY(check_tensor_on(device, op, "k", a.k, DType::kF32, rows, kv_width));
  PD_TRY(check_tensor_on(device, op, "v", a.v, DType::kF32, rows, kv_width));
  PD_TRY(check_tensor_on(device, op, "out", a.out, DType::kF32, rows, q_width));
  PD_TRY(check_tensor_on(device, op, "positions", a.positions, DType::kI32, rows, 1));
  for (const bool is_k : {true, false}) {
    const Tensor& t = is_k ? a.cache.k : a.cache.v;
    const char* arg = is_k ? "cache.k" : "cache.v";
    PD_TRY(check_kv_layout(op, arg, t, kv_width));
    if (t.device != device) {
      return make_error(ErrorCode::kInvalidArgument, "{}: {} is not {} memory", op, arg, device_name(device));
    }
  }
  if (a.cache.k.rows != a.cache.v.rows || a.cache.k.dtype != a.cache.v.dtype) {
    return make_error(ErrorCode::kInvalidArgument, "{}: cache.k and cache.v differ in shape or dtype", op);
  }
  return Status::ok();
}

// An input norm's scratch (when the norm is active): x's shape, aliasing neither x nor out (when given).
inline Status validate_input_norm(Device device, const char* op, const Tensor& x, const InputNorm& n,
                                  const Tensor* out = nullptr) {
  if (!n.active()) return Status::ok();
  PD_TRY(check_tensor_on(device, op, "norm.scratch", n.scratch, DType::kF32, x.rows, x.cols));
  if (n.scratch.data == x.data || (out != nullptr && n.scratch.data == out->data)) {
    return make_error(ErrorCode::kInvalidArgument, "{}: norm.scratch aliases x or out", op);
  }
  return Status::ok();
}

// hidden: the block's width.
inline Status validate_moe_args(Device device, const MoeArgs& a, int64_t hidden) {
  PD_TRY(check_tensor_on(device, "moe", "x", a.x, DType::kF32, -1, hidden));
  PD_TRY(check_tensor_on(device, "moe", "out", a.out, DType::kF32, a.x.rows, hidden));
  if (a.x.data == a.out.data && !a.norm.active()) {
    return make_error(ErrorCode::kInvalidArgument, "moe: out aliases x");
  }
  return validate_input_norm(device, "moe", a.x, a.norm, &a.out);
}

inline Status validate_argmax(Device device, const ArgmaxArgs& a) {
  PD_TRY(check_tensor_on(device, "argmax", "x", a.x, DType::kF32, -1, -1));
  return check_tensor_on(device, "argmax", "out", a.out, DType::kI32, a.x.rows, 1);
}

inline Status check_sample_params(const char* which, const SampleParams& p) {
  const bool ok = p.temperature >= 0.0f && p.temperature < 1e30f && p.top_k >= 0 && p.top_p > 0.0f &&
                  p.top_p <= 1.0f && p.min_p >= 0.0f && p.min_p <= 1.0f && p.repetition_penalty > 0.0f &&
                  p.repetition_penalty < 1e30f && p.presence_penalty > -1e30f && p.presence_penalty < 1e30f &&
                  p.frequency_penalty > -1e30f && p.frequency_penalty < 1e30f;
  if (ok) return Status::ok();
  return make_error(
      ErrorCode::kInvalidArgument,
      "sample: {} params out of range (temperature {}, top_k {}, top_p {}, min_p {}, repetition "
      "{}, presence {}, frequency {})",
      which, p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty, p.presence_penalty,
      p.frequency_penalty);
}

// The sample op's arguments (backend.h SampleArgs), in the memory of `device`.
inline Status validate_sample(const SampleArgs& a, Device device) {
  const char* op = "sample";
  PD_TRY(check_tensor_on(device, op, "logits", a.logits, DType::kF32, -1, -1));
  const int64_t rows = a.logits.rows;
  const int64_t vocab = a.logits.cols;
  if (rows < 1 || rows > kSampleMaxRows || vocab < 1 || vocab > kSampleMaxVocab) {
    return make_error(ErrorCode::kInvalidArgument,
                      "sample: logits is [{}, {}]; rows must be in 1..{} and the vocabulary in 1..{}", rows,
                      vocab, kSampleMaxRows, kSampleMaxVocab);
  }
  const int64_t k = rows - 1;
  const int rule = static_cast<int>(a.rule);
  if (rule < 0 || rule > 3) return make_error(ErrorCode::kInvalidArgument, "sample: unknown rule {}", rule);
  const bool needs_q = a.rule == SampleRule::kTokenwise || a.rule == SampleRule::kBlock;
  const bool faulty_ok = a.faulty == 0 ||
                         ((a.faulty == 1 || a.faulty == 2) && a.rule == SampleRule::kBlock) ||
                         (a.faulty == 3 && a.rule == SampleRule::kTokenwise);
  if (!faulty_ok) {
    return make_error(ErrorCode::kInvalidArgument, "sample: faulty variant {} does not fit rule {}", a.faulty,
                      rule);
  }
  PD_TRY(check_sample_params("target", a.target));
  if (needs_q && k > 0) {
    PD_TRY(check_sample_params("draft", a.draft));
    PD_TRY(check_tensor_on(device, op, "draft_logits", a.draft_logits, DType::kF32, k, vocab));
    if (a.prior != 0) {
      return make_error(ErrorCode::kInvalidArgument, "sample: verifying with draft rows needs prior = 0");
    }
  }
  if (a.prior < 0 || a.prior + k >= kSampleMaxRows) {
    return make_error(ErrorCode::kInvalidArgument, "sample: prior {} with {} drafts exceeds {}", a.prior, k,
                      kSampleMaxRows - 1);
  }
  if (a.write_draft && k != 0) {
    return make_error(ErrorCode::kInvalidArgument, "sample: write_draft needs a single row, got {}", rows);
  }
  const int64_t draft_words = a.prior + k + (a.write_draft ? 1 : 0);
  if (draft_words > 0) {
    PD_TRY(check_tensor_on(device, op, "drafts", a.drafts, DType::kI32, 1, -1));
    if (a.drafts.cols < draft_words) {
      return make_error(ErrorCode::kInvalidArgument, "sample: drafts has {} entries, {} needed",
                        a.drafts.cols, draft_words);
    }
  }
  if (!a.bias.empty()) PD_TRY(check_tensor_on(device, op, "bias", a.bias, DType::kF32, 1, vocab));
  const bool penalised = a.target.penalised() || (needs_q && k > 0 && a.draft.penalised());
  if (penalised || a.commit || !a.history.empty()) {
    PD_TRY(check_tensor_on(device, op, "history", a.history, DType::kI32, 1, vocab));
  }
  PD_TRY(check_tensor_on(device, op, "control", a.control, DType::kI64, 1, kSampleControlWords));
  if (a.logprobs < -1 || a.logprobs > kSampleMaxLogprobs) {
    return make_error(ErrorCode::kInvalidArgument, "sample: logprobs {} outside -1..{}", a.logprobs,
                      kSampleMaxLogprobs);
  }
  return check_tensor_on(device, op, "out", a.out, DType::kI32, 1,
                         sample_out_words(static_cast<int>(rows), a.logprobs));
}

}  // namespace pd
