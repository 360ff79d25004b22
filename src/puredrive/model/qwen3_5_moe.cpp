// qwen3_5_moe / qwen3_next forward pass and MTP head, written against backend.h.
// Math: docs/spec/qwen3_5_moe.md §3-8; reference: transformers' modeling_qwen3_5_moe.py
// (Qwen3_5MoeDecoderLayer, Qwen3_5MoeAttention, Qwen3_5MoeGatedDeltaNet, Qwen3_5MoeSparseMoeBlock) and
// tools/reference/mtp_reference.py. Tests: tests/golden (per-layer agreement with transformers),
// tests/exactness (row-exactness, rollback).
#include "puredrive/model/qwen3_5_moe.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

namespace pd {
namespace {

// ================================ Config ================================

struct Dims {
  int hidden = 0;  // H
  int vocab = 0;   // V
  float eps = 1e-6f;
  AttentionDims attn;
  GdnDims gdn;
  MoeSpec moe;
};

Expected<Dims> make_dims(const ModelConfig& c) {
  auto bad = [&](const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, "{} config: {}", c.model_type, what);
  };
  if (c.hidden_size <= 0 || c.vocab_size <= 0 || c.num_hidden_layers <= 0) {
    return bad(fmt::format("hidden_size {}, vocab_size {}, num_hidden_layers {} must be positive",
                           c.hidden_size, c.vocab_size, c.num_hidden_layers));
  }
  if (static_cast<int>(c.layer_types.size()) != c.num_hidden_layers) {
    return bad(fmt::format("{} layer types for {} layers", c.layer_types.size(), c.num_hidden_layers));
  }
  if (c.num_key_value_heads <= 0 || c.num_attention_heads % c.num_key_value_heads != 0) {
    return bad(fmt::format("num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                           c.num_attention_heads, c.num_key_value_heads));
  }
  if (c.rotary_dim < 0 || c.rotary_dim > c.head_dim || c.rotary_dim % 2 != 0) {
    return bad(fmt::format("rotary dim {} must be even and <= head_dim {}", c.rotary_dim, c.head_dim));
  }
  if (c.num_linear_attention_layers() > 0 &&
      (c.linear_num_key_heads <= 0 || c.linear_num_value_heads % c.linear_num_key_heads != 0)) {
    return bad(fmt::format("linear_num_value_heads ({}) must be a multiple of linear_num_key_heads ({})",
                           c.linear_num_value_heads, c.linear_num_key_heads));
  }
  if (c.num_experts <= 0 || c.num_experts_per_tok <= 0 || c.num_experts_per_tok > c.num_experts) {
    return bad(
        fmt::format("num_experts_per_tok {} with num_experts {}", c.num_experts_per_tok, c.num_experts));
  }
  if (!c.attn_output_gate) return bad("attn_output_gate = false is not supported");
  Dims d;
  d.hidden = c.hidden_size;
  d.vocab = c.vocab_size;
  d.eps = static_cast<float>(c.rms_norm_eps);
  d.attn = {.num_heads = c.num_attention_heads,
            .num_kv_heads = c.num_key_value_heads,
            .head_dim = c.head_dim,
            .rotary_dim = c.rotary_dim,
            .rope_theta = c.rope_theta,
            .eps = d.eps};
  d.gdn = {.num_k_heads = c.linear_num_key_heads,
           .num_v_heads = c.linear_num_value_heads,
           .k_head_dim = c.linear_key_head_dim,
           .v_head_dim = c.linear_value_head_dim,
           .conv_kernel = c.linear_conv_kernel_dim,
           .eps = d.eps};
  // qwen3_5_moe's router renormalises unconditionally; qwen3_next follows norm_topk_prob.
  d.moe = {.num_experts_per_tok = c.num_experts_per_tok,
           .norm_topk_prob = c.arch == Arch::kQwen3_5Moe || c.norm_topk_prob};
  return d;
}

// ================================ Weights ================================

struct AttentionIds {
  MatrixId q_proj, k_proj, v_proj, o_proj;
  VectorId q_norm, k_norm;
};
struct GdnIds {
  MatrixId in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj;
  VectorId conv1d, A_log, dt_bias, norm;
};
struct LayerIds {
  LayerType type = LayerType::kFullAttention;
  VectorId input_layernorm, post_attention_layernorm;
  AttentionIds attn;
  GdnIds gdn;
  MoeId moe;
};
struct MtpIds {
  MatrixId fc;
  VectorId pre_fc_norm_embedding, pre_fc_norm_hidden, norm;
  LayerIds layer;
};

// Binds weights to the backend. Their shapes were checked once, against the same config, where they were
// bound from the checkpoint (model/loader.cpp: errors name the tensor and both shapes), so they are not
// checked again here.
class Binder {
 public:
  explicit Binder(Backend& backend) : be_(backend) {}

  Expected<MatrixId> matrix(const Matrix& m) { return be_.bind_matrix(m); }
  Expected<VectorId> vector(const std::vector<float>& v, const std::string& name) {
    return be_.bind_vector(v, name);
  }

  Expected<LayerIds> layer(const LayerWeights& w, LayerType type, const MoeSpec& moe, const std::string& p) {
    LayerIds ids;
    ids.type = type;
    PD_ASSIGN_OR_RETURN(ids.input_layernorm, vector(w.input_layernorm, p + "input_layernorm"));
    PD_ASSIGN_OR_RETURN(ids.post_attention_layernorm,
                        vector(w.post_attention_layernorm, p + "post_attention_layernorm"));
    if (type == LayerType::kFullAttention) {
      PD_ASSIGN_OR_RETURN(ids.attn.q_proj, matrix(w.attn.q_proj));
      PD_ASSIGN_OR_RETURN(ids.attn.k_proj, matrix(w.attn.k_proj));
      PD_ASSIGN_OR_RETURN(ids.attn.v_proj, matrix(w.attn.v_proj));
      PD_ASSIGN_OR_RETURN(ids.attn.o_proj, matrix(w.attn.o_proj));
      PD_ASSIGN_OR_RETURN(ids.attn.q_norm, vector(w.attn.q_norm, p + "self_attn.q_norm"));
      PD_ASSIGN_OR_RETURN(ids.attn.k_norm, vector(w.attn.k_norm, p + "self_attn.k_norm"));
    } else {
      PD_ASSIGN_OR_RETURN(ids.gdn.in_proj_qkv, matrix(w.gdn.in_proj_qkv));
      PD_ASSIGN_OR_RETURN(ids.gdn.in_proj_z, matrix(w.gdn.in_proj_z));
      PD_ASSIGN_OR_RETURN(ids.gdn.in_proj_b, matrix(w.gdn.in_proj_b));
      PD_ASSIGN_OR_RETURN(ids.gdn.in_proj_a, matrix(w.gdn.in_proj_a));
      PD_ASSIGN_OR_RETURN(ids.gdn.out_proj, matrix(w.gdn.out_proj));
      PD_ASSIGN_OR_RETURN(ids.gdn.conv1d, vector(w.gdn.conv1d, p + "linear_attn.conv1d"));
      PD_ASSIGN_OR_RETURN(ids.gdn.A_log, vector(w.gdn.A_log, p + "linear_attn.A_log"));
      PD_ASSIGN_OR_RETURN(ids.gdn.dt_bias, vector(w.gdn.dt_bias, p + "linear_attn.dt_bias"));
      PD_ASSIGN_OR_RETURN(ids.gdn.norm, vector(w.gdn.norm, p + "linear_attn.norm"));
    }
    PD_ASSIGN_OR_RETURN(ids.moe, be_.bind_moe(w.moe, moe));
    return ids;
  }

 private:
  Backend& be_;
};

// ================================ Forward ================================

class Qwen35Moe final : public Model {
 public:
  Qwen35Moe(const ModelConfig& c, const Dims& d, Backend& be, int max_rows, int max_logit_rows,
            int mtp_draft_vocab, int mtp_window)
      : config_(c),
        d_(d),
        be_(be),
        max_rows_(max_rows),
        max_logit_rows_(max_logit_rows),
        mtp_vocab_(mtp_draft_vocab > 0 ? mtp_draft_vocab : d.vocab),
        mtp_window_(mtp_window) {}

  Status bind(const ModelWeights& w);
  Status allocate_workspace();

  const ModelConfig& config() const override { return config_; }
  Backend& backend() const override { return be_; }
  CacheSpec cache_spec() const override { return qwen3_5_moe_cache_spec(config_, has_mtp() ? 1 : 0); }
  int max_rows() const override { return max_rows_; }
  bool has_mtp() const override { return mtp_.fc.valid(); }

  Expected<StepOutput> forward(SequenceState& st, std::span<const int32_t> tokens,
                               std::span<const int32_t> positions, const ForwardOptions& o) override;
  Expected<StepOutput> mtp_forward(SequenceState& st, std::span<const int32_t> tokens,
                                   std::span<const int32_t> positions, const Tensor& hidden,
                                   const ForwardOptions& o) override;

 private:
  // The caches one decoder layer uses.
  struct LayerCaches {
    KvCache kv = {};
    GdnState gdn = {};
    GdnSnapshots snapshots = {};
    int32_t kv_length = 0;  // the step's last position + 1
    int32_t first_position = 0;
    int32_t window = 0;  // attention over the last `window` positions only (the MTP head's option)
  };

  Status check_rows(std::span<const int32_t> tokens, std::span<const int32_t> positions, int first,
                    int capacity, LogitRows logits, const char* what) const;
  Status decoder_layer(const LayerIds& w, const LayerCaches& cache, const Tensor& h, int64_t rows,
                       bool prefill);
  Status attention(const AttentionIds& w, const LayerCaches& cache, const Tensor& h, const InputNorm& norm,
                   const Tensor& out, int64_t rows, bool prefill);
  Status gated_delta_net(const GdnIds& w, const LayerCaches& cache, const Tensor& h, const InputNorm& norm,
                         const Tensor& out, int64_t rows, bool prefill);
  // The output head over `vocab` rows of `head` into the first `vocab` columns of `logits`.
  Expected<Tensor> lm_head(const Tensor& hidden, MatrixId head, int vocab, const Buffer& logits,
                           const ForwardOptions& o);
  // Puts the step's token ids into the workspace: uploaded from the host, or copied from
  // ForwardOptions::device_tokens for the rows it covers.
  Status load_tokens(std::span<const int32_t> tokens, const ForwardOptions& o, const char* what);
  static void tap(const ForwardOptions& o, const std::string& name, const Tensor& t) {
    if (o.tap) o.tap(name, t);
  }
  Tensor rows(const Buffer& b, int64_t n) const { return b.row_slice(0, n); }

  ModelConfig config_;
  Dims d_;
  Backend& be_;
  int max_rows_;
  int max_logit_rows_;
  int mtp_vocab_;  // V, or the draft vocabulary of the MTP head's lm_head
  int mtp_window_;

  MatrixId embed_tokens_, lm_head_;
  MatrixId mtp_lm_head_;  // lm_head_, or its first mtp_vocab_ rows
  VectorId final_norm_;
  std::vector<LayerIds> layers_;
  MtpIds mtp_;

  // Workspace, [max_rows, ...] each; the logits [max_logit_rows, V].
  struct Workspace {
    Buffer tokens, positions;            // I32 [M, 1]
    Buffer x, u;                         // [M, H]: residual stream, normed input
    Buffer qg, k, v, attn;               // attention
    Buffer qkv, z, b, a, gdn;            // GDN
    Buffer hidden, logits;               // forward outputs
    Buffer cat, mtp_hidden, mtp_logits;  // MTP: [M, 2H] fc input, outputs
  } ws_;
};

Status Qwen35Moe::bind(const ModelWeights& w) {
  Binder b(be_);
  PD_ASSIGN_OR_RETURN(embed_tokens_, b.matrix(w.embed_tokens));
  PD_ASSIGN_OR_RETURN(lm_head_, b.matrix(w.lm_head));
  PD_ASSIGN_OR_RETURN(final_norm_, b.vector(w.norm, "model.norm"));
  if (static_cast<int>(w.layers.size()) != config_.num_hidden_layers) {
    return make_error(ErrorCode::kInvalidArgument, "weights hold {} layers, config has {}", w.layers.size(),
                      config_.num_hidden_layers);
  }
  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    PD_ASSIGN_OR_RETURN(LayerIds ids,
                        b.layer(w.layers[static_cast<size_t>(l)], config_.layer_types[static_cast<size_t>(l)],
                                d_.moe, fmt::format("model.layers.{}.", l)));
    layers_.push_back(ids);
  }
  if (w.mtp && !w.mtp->layers.empty()) {
    if (w.mtp->layers.size() > 1) {
      return make_error(ErrorCode::kUnsupported, "MTP head with {} layers: only one MTP layer is supported",
                        w.mtp->layers.size());
    }
    PD_ASSIGN_OR_RETURN(mtp_.fc, b.matrix(w.mtp->fc));
    PD_ASSIGN_OR_RETURN(mtp_.pre_fc_norm_embedding,
                        b.vector(w.mtp->pre_fc_norm_embedding, "mtp.pre_fc_norm_embedding"));
    PD_ASSIGN_OR_RETURN(mtp_.pre_fc_norm_hidden,
                        b.vector(w.mtp->pre_fc_norm_hidden, "mtp.pre_fc_norm_hidden"));
    PD_ASSIGN_OR_RETURN(mtp_.norm, b.vector(w.mtp->norm, "mtp.norm"));
    PD_ASSIGN_OR_RETURN(mtp_.layer,
                        b.layer(w.mtp->layers[0], LayerType::kFullAttention, d_.moe, "mtp.layers.0."));
    mtp_lm_head_ = lm_head_;
    if (mtp_vocab_ < d_.vocab) {
      // The first rows of the shared matrix, bound once more (the CPU keeps a view, a device a copy).
      PD_ASSIGN_OR_RETURN(mtp_lm_head_, b.matrix(w.lm_head.row_slice(0, mtp_vocab_)));
    }
  }
  return Status::ok();
}

Status Qwen35Moe::allocate_workspace() {
  const int64_t M = max_rows_;
  const int64_t H = d_.hidden;
  const int64_t q = int64_t{d_.attn.num_heads} * d_.attn.head_dim;
  const int64_t kv = int64_t{d_.attn.num_kv_heads} * d_.attn.head_dim;
  auto f32 = [&](Buffer* b, int64_t cols) -> Status {
    PD_ASSIGN_OR_RETURN(*b, be_.alloc(DType::kF32, M, cols));
    return Status::ok();
  };
  PD_ASSIGN_OR_RETURN(ws_.tokens, be_.alloc(DType::kI32, M, 1));
  PD_ASSIGN_OR_RETURN(ws_.positions, be_.alloc(DType::kI32, M, 1));
  PD_TRY(f32(&ws_.x, H));
  PD_TRY(f32(&ws_.u, H));
  PD_TRY(f32(&ws_.qg, 2 * q));
  PD_TRY(f32(&ws_.k, kv));
  PD_TRY(f32(&ws_.v, kv));
  PD_TRY(f32(&ws_.attn, q));
  if (config_.num_linear_attention_layers() > 0) {
    PD_TRY(f32(&ws_.qkv, config_.conv_dim()));
    PD_TRY(f32(&ws_.z, config_.value_dim()));
    PD_TRY(f32(&ws_.b, d_.gdn.num_v_heads));
    PD_TRY(f32(&ws_.a, d_.gdn.num_v_heads));
    PD_TRY(f32(&ws_.gdn, config_.value_dim()));
  }
  PD_TRY(f32(&ws_.hidden, H));
  PD_ASSIGN_OR_RETURN(ws_.logits, be_.alloc(DType::kF32, max_logit_rows_, d_.vocab));
  if (has_mtp()) {
    PD_TRY(f32(&ws_.cat, 2 * H));
    PD_TRY(f32(&ws_.mtp_hidden, H));
    PD_ASSIGN_OR_RETURN(ws_.mtp_logits, be_.alloc(DType::kF32, max_logit_rows_, d_.vocab));
    if (mtp_vocab_ < d_.vocab) {
      // Ids past the draft vocabulary get -inf once; the head's lm_head never writes them.
      const int64_t tail = d_.vocab - mtp_vocab_;
      const std::vector<float> ninf(static_cast<size_t>(max_logit_rows_ * tail),
                                    -std::numeric_limits<float>::infinity());
      const Tensor t = ws_.mtp_logits.tensor().col_slice(mtp_vocab_, tail);
      PD_TRY(be_.upload(t, ninf.data()));
    }
  }
  return Status::ok();
}

Status Qwen35Moe::check_rows(std::span<const int32_t> tokens, std::span<const int32_t> positions, int first,
                             int capacity, LogitRows logits, const char* what) const {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0 || n > max_rows_) {
    return make_error(ErrorCode::kInvalidArgument, "{}: {} rows; a step takes 1..{}", what, n, max_rows_);
  }
  if (logits == LogitRows::kAll && n > max_logit_rows_) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: logits of all {} rows requested; the model keeps logits for at most {} rows "
                      "(ModelOptions::max_logit_rows)",
                      what, n, max_logit_rows_);
  }
  if (positions.size() != tokens.size()) {
    return make_error(ErrorCode::kInvalidArgument, "{}: {} tokens but {} positions", what, n,
                      positions.size());
  }
  for (int64_t r = 0; r < n; ++r) {
    if (positions[static_cast<size_t>(r)] != first + r) {
      return make_error(ErrorCode::kInvalidArgument, "{}: row {} has position {}, expected {}", what, r,
                        positions[static_cast<size_t>(r)], first + r);
    }
  }
  if (first + n > capacity) {
    return make_error(ErrorCode::kInvalidArgument, "{}: positions up to {} exceed the context size {}", what,
                      first + n - 1, capacity);
  }
  return Status::ok();
}

// h = h + mixer(input_layernorm(h)); h = h + moe(post_attention_layernorm(h))   (spec §7)
Status Qwen35Moe::decoder_layer(const LayerIds& w, const LayerCaches& cache, const Tensor& h, int64_t n,
                                bool prefill) {
  // The norms go to the ops that read them (InputNorm), which a backend may fuse into their kernels. The
  // mixers' output products and the MoE block add into h themselves (Accum::kAdd): one rounding per
  // element, as h + mix.
  const Tensor u = rows(ws_.u, n);
  const InputNorm input_norm{.weight = w.input_layernorm, .eps = d_.eps, .scratch = u};
  if (w.type == LayerType::kLinearAttention) {
    PD_TRY(gated_delta_net(w.gdn, cache, h, input_norm, h, n, prefill));
  } else {
    PD_TRY(attention(w.attn, cache, h, input_norm, h, n, prefill));
  }
  return be_.moe({.moe = w.moe,
                  .x = h,
                  .norm = {.weight = w.post_attention_layernorm, .eps = d_.eps, .scratch = u},
                  .out = h,
                  .accum = Accum::kAdd,
                  .prefill = prefill});
}

// Gated attention (spec §4): out = o_proj((softmax(q k^T / sqrt(D)) v) * sigmoid(gate)).
Status Qwen35Moe::attention(const AttentionIds& w, const LayerCaches& cache, const Tensor& h,
                            const InputNorm& norm, const Tensor& out, int64_t n, bool prefill) {
  const Tensor qg = rows(ws_.qg, n), k = rows(ws_.k, n), v = rows(ws_.v, n), a = rows(ws_.attn, n);
  const MatmulTarget proj[] = {{w.q_proj, qg}, {w.k_proj, k}, {w.v_proj, v}};
  PD_TRY(be_.matmuls({.x = h, .targets = proj, .norm = norm, .prefill = prefill}));
  PD_TRY(be_.gated_attention({.dims = d_.attn,
                              .qg = qg,
                              .k = k,
                              .v = v,
                              .q_norm = w.q_norm,
                              .k_norm = w.k_norm,
                              .positions = rows(ws_.positions, n),
                              .kv_length = cache.kv_length,
                              .cache = cache.kv,
                              .out = a,
                              .prefill = prefill,
                              .window = cache.window}));
  return be_.matmul({.w = w.o_proj, .x = a, .out = out, .accum = Accum::kAdd, .prefill = prefill});
}

// Gated DeltaNet (spec §5): projections, then conv + delta rule + gated norm in one op, then out_proj.
Status Qwen35Moe::gated_delta_net(const GdnIds& w, const LayerCaches& cache, const Tensor& h,
                                  const InputNorm& norm, const Tensor& out, int64_t n, bool prefill) {
  const Tensor qkv = rows(ws_.qkv, n), z = rows(ws_.z, n), b = rows(ws_.b, n), a = rows(ws_.a, n);
  const Tensor core = rows(ws_.gdn, n);
  const MatmulTarget proj[] = {{w.in_proj_qkv, qkv}, {w.in_proj_z, z}, {w.in_proj_b, b}, {w.in_proj_a, a}};
  PD_TRY(be_.matmuls({.x = h, .targets = proj, .norm = norm, .prefill = prefill}));
  PD_TRY(be_.gated_delta_net({.dims = d_.gdn,
                              .qkv = qkv,
                              .z = z,
                              .b = b,
                              .a = a,
                              .conv1d = w.conv1d,
                              .A_log = w.A_log,
                              .dt_bias = w.dt_bias,
                              .norm = w.norm,
                              .state = cache.gdn,
                              .snapshots = cache.snapshots,
                              .out = core,
                              .prefill = prefill,
                              .position = cache.first_position}));
  return be_.matmul({.w = w.out_proj, .x = core, .out = out, .accum = Accum::kAdd, .prefill = prefill});
}

Expected<Tensor> Qwen35Moe::lm_head(const Tensor& hidden, MatrixId head, int vocab, const Buffer& logits,
                                    const ForwardOptions& o) {
  if (o.logits == LogitRows::kNone) return Tensor{};
  const Tensor x = o.logits == LogitRows::kLast ? hidden.row_slice(hidden.rows - 1, 1) : hidden;
  const Tensor out = rows(logits, x.rows);
  PD_TRY(be_.matmul({.w = head, .x = x, .out = out.col_slice(0, vocab), .prefill = o.prefill}));
  return out;
}

Status Qwen35Moe::load_tokens(std::span<const int32_t> tokens, const ForwardOptions& o, const char* what) {
  const auto n = static_cast<int64_t>(tokens.size());
  const Tensor& dev = o.device_tokens;
  const int64_t from = dev.empty() ? n : o.device_tokens_from;
  if (from < 0 || from > n) {
    return make_error(ErrorCode::kInvalidArgument, "{}: device tokens from row {} of a {}-row step", what,
                      from, n);
  }
  if (from < n && (dev.dtype != DType::kI32 || dev.rows != 1 || dev.cols < n - from)) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: device tokens are [{}, {}] {}, rows {}..{} need I32 [1, >= {}]", what, dev.rows,
                      dev.cols, dtype_name(dev.dtype), from, n - 1, n - from);
  }
  if (from > 0) PD_TRY(be_.upload(rows(ws_.tokens, from), tokens.data()));
  if (from < n) {
    PD_TRY(be_.copy(ws_.tokens.row_slice(from, n - from), dev.col_slice(0, n - from).reshaped(n - from, 1)));
  }
  return Status::ok();
}

Expected<StepOutput> Qwen35Moe::forward(SequenceState& st, std::span<const int32_t> tokens,
                                        std::span<const int32_t> positions, const ForwardOptions& o) {
  PD_TRY(check_rows(tokens, positions, st.length(), st.capacity(), o.logits, "forward"));
  const int64_t n = static_cast<int64_t>(tokens.size());
  PD_TRY(load_tokens(tokens, o, "forward"));
  PD_TRY(be_.upload(rows(ws_.positions, n), positions.data()));
  // Per-row GDN snapshots make every row of a verify step a rollback point; prefill rows are none.
  const bool snapshots = !o.prefill && n > 1 && n <= st.max_rows();

  const Tensor h = rows(ws_.x, n);
  PD_TRY(be_.embed({.table = embed_tokens_, .tokens = rows(ws_.tokens, n), .out = h}));
  tap(o, "embed", h);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const int li = static_cast<int>(l);
    LayerCaches cache;
    cache.kv_length = positions.back() + 1;
    cache.first_position = positions.front();
    if (layers_[l].type == LayerType::kFullAttention) {
      cache.kv = st.kv(li);
    } else {
      cache.gdn = st.gdn(li);
      if (snapshots) cache.snapshots = st.snapshots(li);
    }
    PD_TRY(decoder_layer(layers_[l], cache, h, n, o.prefill));
    tap(o, fmt::format("L{}.out", l), h);
  }
  const Tensor hidden = rows(ws_.hidden, n);
  PD_TRY(be_.rms_norm({.x = h, .weight = final_norm_, .eps = d_.eps, .out = hidden}));
  tap(o, "final_hidden", hidden);
  PD_ASSIGN_OR_RETURN(Tensor logits, lm_head(hidden, lm_head_, d_.vocab, ws_.logits, o));
  st.commit_step(static_cast<int>(n), snapshots);
  return StepOutput{.logits = logits, .hidden = hidden};
}

// MTP head (spec §8.1): out = mtp.norm(layer(fc([norm_e(embed(token)), norm_h(hidden)]))) at the hidden's
// position, with the layer's own KV cache; logits from the shared lm_head.
Expected<StepOutput> Qwen35Moe::mtp_forward(SequenceState& st, std::span<const int32_t> tokens,
                                            std::span<const int32_t> positions, const Tensor& hidden,
                                            const ForwardOptions& o) {
  if (!has_mtp()) return make_error(ErrorCode::kUnsupported, "mtp_forward: the checkpoint has no MTP head");
  if (positions.empty()) return make_error(ErrorCode::kInvalidArgument, "mtp_forward: no rows");
  const int first = positions[0];
  if (first < 0 || first > st.mtp_length()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "mtp_forward: first position {} leaves a gap after the {} cached MTP positions", first,
                      st.mtp_length());
  }
  PD_TRY(check_rows(tokens, positions, first, st.capacity(), o.logits, "mtp_forward"));
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t H = d_.hidden;
  if (hidden.dtype != DType::kF32 || hidden.rows != n || hidden.cols != H) {
    return make_error(ErrorCode::kInvalidArgument,
                      "mtp_forward: hidden is [{}, {}] {}, expected [{}, {}] F32", hidden.rows, hidden.cols,
                      dtype_name(hidden.dtype), n, H);
  }
  PD_TRY(load_tokens(tokens, o, "mtp_forward"));
  PD_TRY(be_.upload(rows(ws_.positions, n), positions.data()));

  // The embedding comes first in fc's input, the hidden state second.
  const Tensor cat = rows(ws_.cat, n);
  const Tensor e = rows(ws_.u, n);
  PD_TRY(be_.embed({.table = embed_tokens_, .tokens = rows(ws_.tokens, n), .out = e}));
  PD_TRY(be_.rms_norm(
      {.x = e, .weight = mtp_.pre_fc_norm_embedding, .eps = d_.eps, .out = cat.col_slice(0, H)}));
  PD_TRY(be_.rms_norm(
      {.x = hidden, .weight = mtp_.pre_fc_norm_hidden, .eps = d_.eps, .out = cat.col_slice(H, H)}));
  const Tensor h = rows(ws_.x, n);
  PD_TRY(be_.matmul({.w = mtp_.fc, .x = cat, .out = h, .prefill = o.prefill}));
  tap(o, "mtp.fc", h);
  PD_TRY(decoder_layer(mtp_.layer,
                       {.kv = st.mtp_kv(0), .kv_length = positions.back() + 1, .window = mtp_window_}, h, n,
                       o.prefill));
  tap(o, "mtp.L0.out", h);
  const Tensor out = rows(ws_.mtp_hidden, n);
  PD_TRY(be_.rms_norm({.x = h, .weight = mtp_.norm, .eps = d_.eps, .out = out}));
  tap(o, "mtp.hidden", out);
  PD_ASSIGN_OR_RETURN(Tensor logits, lm_head(out, mtp_lm_head_, mtp_vocab_, ws_.mtp_logits, o));
  st.commit_mtp(first, static_cast<int>(n));
  return StepOutput{.logits = logits, .hidden = out};
}

}  // namespace

// ================================ CacheSpec ================================

CacheSpec qwen3_5_moe_cache_spec(const ModelConfig& c, int mtp_layers) {
  CacheSpec s;
  s.layers = c.layer_types;
  s.kv_width = c.num_key_value_heads * c.head_dim;
  s.conv_channels = c.conv_dim();
  s.conv_kernel = c.linear_conv_kernel_dim;
  s.recurrent_heads = c.linear_num_value_heads;
  s.recurrent_size = c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim;
  s.mtp_layers = mtp_layers;
  return s;
}

Expected<std::unique_ptr<Model>> create_qwen3_5_moe(const ModelConfig& config, const ModelWeights& weights,
                                                    Backend& backend, const ModelOptions& options) {
  if (options.max_rows <= 0 || options.max_logit_rows < 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "max rows per step must be positive and max logit rows not negative, got {} and {}",
                      options.max_rows, options.max_logit_rows);
  }
  if (options.mtp_draft_vocab < 0 || options.mtp_draft_vocab > config.vocab_size) {
    return make_error(ErrorCode::kInvalidArgument, "MTP draft vocabulary {} must be in 0..{} (0: all)",
                      options.mtp_draft_vocab, config.vocab_size);
  }
  if (options.mtp_window < 0) {
    return make_error(ErrorCode::kInvalidArgument, "MTP attention window {} must not be negative",
                      options.mtp_window);
  }
  PD_ASSIGN_OR_RETURN(Dims d, make_dims(config));
  const int logit_rows =
      options.max_logit_rows == 0 ? options.max_rows : std::min(options.max_logit_rows, options.max_rows);
  auto m = std::make_unique<Qwen35Moe>(config, d, backend, options.max_rows, logit_rows,
                                       options.mtp_draft_vocab, options.mtp_window);
  PD_TRY(m->bind(weights));
  PD_TRY(m->allocate_workspace());
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace pd
