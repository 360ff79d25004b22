#include "cli/synth_checkpoint.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "puredrive/backend/cuda/synth_rng.h"
#include "puredrive/backend/cuda/synth_source.h"
#include "puredrive/checkpoint/sharded_writer.h"
#include "puredrive/model/loader.h"
#include "puredrive/model/quantize.h"
#include "puredrive/tokenizer/tokenizer.h"
#include "puredrive/util/mapped_file.h"
#include "puredrive/util/parallel_jobs.h"
#include "puredrive/util/progress.h"

namespace pd::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Work is cut into pieces of at most this many output bytes (parallelism), produced in chunks of at most
// kChunkBytes (memory per thread).
constexpr uint64_t kJobBytes = 64ull << 20;
constexpr uint64_t kChunkBytes = 4ull << 20;
// Random vision-tower weights: small, like trained ones; the loader skips them.
constexpr float kVisionAmplitude = 0.02f;

// One tensor of the bf16 (HF) layout, viewed as [rows, row_elems], and where its values come from: matrices
// stacked along rows (a fused expert tensor is gate_0, up_0, gate_1, ...), a host vector, a constant, or
// random values (vision tower).
struct HfTensor {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  int64_t rows = 0, row_elems = 0;
  std::vector<const Matrix*> pieces;
  std::vector<int64_t> piece_start;
  const std::vector<float>* values = nullptr;
  float offset = 0.0f;  // added to `values` (-1: zero-centred norms, which HF stores as w with 1 + w applied)
  float constant = 0.0f;
  uint64_t random_seed = 0;
  float random_amplitude = 0.0f;

  uint64_t nbytes() const { return static_cast<uint64_t>(rows * row_elems) * dtype_size(dtype); }
  // The piece holding row r and r's row within it.
  std::pair<const Matrix*, int64_t> piece(int64_t r) const {
    const size_t k = static_cast<size_t>(std::upper_bound(piece_start.begin(), piece_start.end(), r) -
                                         piece_start.begin()) -
                     1;
    return {pieces[k], r - piece_start[k]};
  }
};

Expected<const synth::SynthSource*> source_of(const Matrix& m) {
  const synth::SynthSource* s = synth::find_source(m.data);
  if (s == nullptr) {
    return make_error(ErrorCode::kInternal, "synth --write: matrix {} has no generator (materialised model?)",
                      m.name);
  }
  return s;
}

class HfListing {
 public:
  explicit HfListing(const SynthModel& m) : m_(m) {}

  std::vector<HfTensor> build() {
    const ModelWeights& w = m_.weights;
    const std::string lm = "model.language_model.";
    add_matrix(lm + "embed_tokens.weight", w.embed_tokens);
    for (size_t l = 0; l < w.layers.size(); ++l)
      add_layer(fmt::format("{}layers.{}.", lm, l), w.layers[l], true);
    add_vector(lm + "norm.weight", w.norm, {hidden()}, DType::kBF16, -1.0f);
    add_matrix("lm_head.weight", w.lm_head);
    if (w.mtp) {
      // Qwen3.5-35B-A3B stores the MTP layer's experts one by one (spec §2.3).
      add_matrix("mtp.fc.weight", w.mtp->fc);
      add_vector("mtp.pre_fc_norm_embedding.weight", w.mtp->pre_fc_norm_embedding, {hidden()}, DType::kBF16,
                 -1);
      add_vector("mtp.pre_fc_norm_hidden.weight", w.mtp->pre_fc_norm_hidden, {hidden()}, DType::kBF16, -1);
      add_vector("mtp.norm.weight", w.mtp->norm, {hidden()}, DType::kBF16, -1);
      for (size_t j = 0; j < w.mtp->layers.size(); ++j) {
        add_layer(fmt::format("mtp.layers.{}.", j), w.mtp->layers[j], false);
      }
    }
    add_vision();
    return std::move(out_);
  }

 private:
  int64_t hidden() const { return m_.config.hidden_size; }

  HfTensor& add(const std::string& name, DType dtype, std::vector<int64_t> shape) {
    HfTensor& t = out_.emplace_back();
    t.name = name;
    t.dtype = dtype;
    t.row_elems = shape.back();
    t.rows = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) t.rows *= shape[i];
    t.shape = std::move(shape);
    return t;
  }
  void add_stacked(const std::string& name, std::vector<const Matrix*> pieces, std::vector<int64_t> shape) {
    HfTensor& t = add(name, DType::kBF16, std::move(shape));
    int64_t start = 0;
    for (const Matrix* p : pieces) {
      t.piece_start.push_back(start);
      start += p->rows;
    }
    t.pieces = std::move(pieces);
  }
  void add_matrix(const std::string& name, const Matrix& mat) {
    add_stacked(name, {&mat}, {mat.rows, mat.cols});
  }
  void add_vector(const std::string& name, const std::vector<float>& v, std::vector<int64_t> shape,
                  DType dtype, float offset) {
    HfTensor& t = add(name, dtype, std::move(shape));
    t.values = &v;
    t.offset = offset;
  }
  void add_constant(const std::string& name, std::vector<int64_t> shape, float value) {
    add(name, DType::kBF16, std::move(shape)).constant = value;
  }
  void add_random(const std::string& name, std::vector<int64_t> shape) {
    HfTensor& t = add(name, DType::kBF16, std::move(shape));
    t.random_seed = synth::tensor_seed(m_.seed, name.c_str());
    t.random_amplitude = kVisionAmplitude;
  }

  void add_layer(const std::string& p, const LayerWeights& lw, bool fused_experts) {
    const ModelConfig& c = m_.config;
    const int64_t H = hidden();
    add_vector(p + "input_layernorm.weight", lw.input_layernorm, {H}, DType::kBF16, -1);
    add_vector(p + "post_attention_layernorm.weight", lw.post_attention_layernorm, {H}, DType::kBF16, -1);
    if (lw.type == LayerType::kFullAttention) {
      const AttentionWeights& a = lw.attn;
      add_matrix(p + "self_attn.q_proj.weight", a.q_proj);
      add_matrix(p + "self_attn.k_proj.weight", a.k_proj);
      add_matrix(p + "self_attn.v_proj.weight", a.v_proj);
      add_matrix(p + "self_attn.o_proj.weight", a.o_proj);
      add_vector(p + "self_attn.q_norm.weight", a.q_norm, {c.head_dim}, DType::kBF16, -1);
      add_vector(p + "self_attn.k_norm.weight", a.k_norm, {c.head_dim}, DType::kBF16, -1);
    } else {
      const GdnWeights& g = lw.gdn;
      const std::string a = p + "linear_attn.";
      add_matrix(a + "in_proj_qkv.weight", g.in_proj_qkv);
      add_matrix(a + "in_proj_z.weight", g.in_proj_z);
      add_matrix(a + "in_proj_b.weight", g.in_proj_b);
      add_matrix(a + "in_proj_a.weight", g.in_proj_a);
      add_vector(a + "conv1d.weight", g.conv1d, {c.conv_dim(), 1, c.linear_conv_kernel_dim}, DType::kBF16, 0);
      add_vector(a + "dt_bias", g.dt_bias, {c.linear_num_value_heads}, DType::kBF16, 0);
      add_vector(a + "A_log", g.A_log, {c.linear_num_value_heads}, DType::kF32, 0);
      add_vector(a + "norm.weight", g.norm, {c.linear_value_head_dim}, DType::kF32, 0);
      add_matrix(a + "out_proj.weight", g.out_proj);
    }
    const MoeWeights& e = lw.moe;
    add_matrix(p + "mlp.gate.weight", e.gate);
    const int64_t E = static_cast<int64_t>(e.gate_proj.size());
    if (fused_experts) {
      std::vector<const Matrix*> gate_up, down;
      for (int64_t i = 0; i < E; ++i) {
        gate_up.push_back(&e.gate_proj[i]);
        gate_up.push_back(&e.up_proj[i]);
        down.push_back(&e.down_proj[i]);
      }
      add_stacked(p + "mlp.experts.gate_up_proj", gate_up, {E, 2 * c.moe_intermediate_size, H});
      add_stacked(p + "mlp.experts.down_proj", down, {E, H, c.moe_intermediate_size});
    } else {
      for (int64_t i = 0; i < E; ++i) {
        const std::string x = fmt::format("{}mlp.experts.{}.", p, i);
        add_matrix(x + "gate_proj.weight", e.gate_proj[i]);
        add_matrix(x + "up_proj.weight", e.up_proj[i]);
        add_matrix(x + "down_proj.weight", e.down_proj[i]);
      }
    }
    add_matrix(p + "mlp.shared_expert.gate_proj.weight", e.shared_gate_proj);
    add_matrix(p + "mlp.shared_expert.up_proj.weight", e.shared_up_proj);
    add_matrix(p + "mlp.shared_expert.down_proj.weight", e.shared_down_proj);
    add_matrix(p + "mlp.shared_expert_gate.weight", e.shared_expert_gate);
  }

  // The tensors of the published vision tower (27 blocks for the 35B), which PureDrive skips at load.
  void add_vision() {
    const VisionShape& v = m_.vision;
    const int64_t d = v.hidden, merged = int64_t{v.hidden} * v.merge * v.merge;
    const std::string p = "model.visual.";
    add_random(p + "patch_embed.proj.weight", {d, 3, v.temporal_patch, v.patch, v.patch});
    add_constant(p + "patch_embed.proj.bias", {d}, 0.0f);
    add_random(p + "pos_embed.weight", {v.positions, d});
    for (int b = 0; b < v.depth; ++b) {
      const std::string x = fmt::format("{}blocks.{}.", p, b);
      add_random(x + "attn.qkv.weight", {3 * d, d});
      add_constant(x + "attn.qkv.bias", {3 * d}, 0.0f);
      add_random(x + "attn.proj.weight", {d, d});
      add_constant(x + "attn.proj.bias", {d}, 0.0f);
      add_random(x + "mlp.linear_fc1.weight", {v.intermediate, d});
      add_constant(x + "mlp.linear_fc1.bias", {v.intermediate}, 0.0f);
      add_random(x + "mlp.linear_fc2.weight", {d, v.intermediate});
      add_constant(x + "mlp.linear_fc2.bias", {d}, 0.0f);
      add_constant(x + "norm1.weight", {d}, 1.0f);
      add_constant(x + "norm1.bias", {d}, 0.0f);
      add_constant(x + "norm2.weight", {d}, 1.0f);
      add_constant(x + "norm2.bias", {d}, 0.0f);
    }
    add_constant(p + "merger.norm.weight", {d}, 1.0f);
    add_constant(p + "merger.norm.bias", {d}, 0.0f);
    add_random(p + "merger.linear_fc1.weight", {merged, merged});
    add_constant(p + "merger.linear_fc1.bias", {merged}, 0.0f);
    add_random(p + "merger.linear_fc2.weight", {hidden(), merged});
    add_constant(p + "merger.linear_fc2.bias", {hidden()}, 0.0f);
  }

  const SynthModel& m_;
  std::vector<HfTensor> out_;
};

// Elements [begin, begin + count) of t in row-major order, as floats before rounding to t.dtype.
Status float_elems(const HfTensor& t, int64_t begin, int64_t count, float* out) {
  const int64_t E = t.row_elems;
  for (int64_t i = begin; i < begin + count;) {
    const int64_t r = i / E, c0 = i % E, n = std::min(E - c0, begin + count - i);
    float* o = out + (i - begin);
    if (!t.pieces.empty()) {
      const auto [m, lr] = t.piece(r);
      if (m->format != WeightFormat::kBF16) {
        return make_error(ErrorCode::kInternal, "synth --write: {} is {}, expected bf16", m->name,
                          weight_format_name(m->format));
      }
      PD_ASSIGN_OR_RETURN(const synth::SynthSource* src, source_of(*m));
      for (int64_t c = 0; c < n; ++c) {
        o[c] = synth::dense_value(src->seed, src->amplitude, static_cast<uint64_t>(lr * E + c0 + c));
      }
    } else if (t.values != nullptr) {
      for (int64_t c = 0; c < n; ++c) o[c] = (*t.values)[static_cast<size_t>(i + c)] + t.offset;
    } else if (t.random_amplitude > 0.0f) {
      for (int64_t c = 0; c < n; ++c) {
        o[c] = synth::dense_value(t.random_seed, t.random_amplitude, static_cast<uint64_t>(i + c));
      }
    } else {
      std::fill(o, o + n, t.constant);
    }
    i += n;
  }
  return Status::ok();
}

void store_floats(const float* v, size_t n, DType dtype, uint8_t* out) {
  for (size_t i = 0; i < n; ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(out + 4 * i, &v[i], 4);
    } else {
      const uint16_t h = f32_to_bf16(v[i]);
      std::memcpy(out + 2 * i, &h, 2);
    }
  }
}

// MLX affine rows of t: the pieces' random code words and their constant scales and biases (bf16).
Status affine_rows(const HfTensor& t, int64_t r0, int64_t n, const QuantParams& q, uint32_t* words,
                   uint16_t* scales, uint16_t* biases) {
  const int64_t wpr = t.row_elems * q.bits / 32, gpr = t.row_elems / q.group_size;
  for (int64_t r = r0; r < r0 + n; ++r) {
    const auto [m, lr] = t.piece(r);
    if (m->format != WeightFormat::kAffine || m->bits != q.bits || m->group_size != q.group_size ||
        m->scale_dtype != DType::kBF16) {
      return make_error(
          ErrorCode::kInternal,
          "synth --write: {} is {} {}-bit group {}, but the recipe quantizes it {}-bit group {}", m->name,
          weight_format_name(m->format), m->bits, m->group_size, q.bits, q.group_size);
    }
    PD_ASSIGN_OR_RETURN(const synth::SynthSource* src, source_of(*m));
    uint32_t* w = words + (r - r0) * wpr;
    for (int64_t j = 0; j < wpr; ++j)
      w[j] = synth::affine_word(src->seed, static_cast<uint64_t>(lr * wpr + j));
    std::fill(scales + (r - r0) * gpr, scales + (r - r0 + 1) * gpr,
              f32_to_bf16(synth::affine_scale(src->amplitude, q.bits)));
    std::fill(biases + (r - r0) * gpr, biases + (r - r0 + 1) * gpr,
              f32_to_bf16(synth::affine_bias(src->amplitude)));
  }
  return Status::ok();
}

// A unit of work: output rows [first, first + rows) of one tensor (HF) or one planned module (MLX).
struct WorkItem {
  size_t unit = 0;
  int64_t first = 0, rows = 0;
};

std::vector<WorkItem> split_rows(size_t unit, int64_t rows, uint64_t row_bytes) {
  std::vector<WorkItem> out;
  const int64_t per =
      std::max<int64_t>(1, static_cast<int64_t>(kJobBytes / std::max<uint64_t>(row_bytes, 1)));
  for (int64_t r = 0; r < rows; r += per) out.push_back({unit, r, std::min(per, rows - r)});
  return out;
}

// Rows in chunks of at most kChunkBytes of output.
template <typename F>
Status for_chunks(const WorkItem& w, uint64_t row_bytes, F&& fn) {
  const int64_t per =
      std::max<int64_t>(1, static_cast<int64_t>(kChunkBytes / std::max<uint64_t>(row_bytes, 1)));
  for (int64_t r = w.first; r < w.first + w.rows; r += per)
    PD_TRY(fn(r, std::min(per, w.first + w.rows - r)));
  return Status::ok();
}

// Runs the items, counting output bytes for the progress line.
Status run_items(const std::vector<WorkItem>& items, int threads, uint64_t total, bool progress,
                 const std::function<Status(const WorkItem&, std::atomic<uint64_t>&)>& fn) {
  std::atomic<uint64_t> done{0};
  Progress bar("synth --write", total, progress ? Progress::Mode::kAuto : Progress::Mode::kOff);
  const Status st = run_parallel_jobs(
      items.size(), threads, [&](size_t i) { return fn(items[i], done); }, [&] { bar.update(done.load()); });
  bar.finish();
  return st;
}

Status write_hf(const std::vector<HfTensor>& hf, const SynthWriteOptions& o, SynthWriteSummary* sum) {
  std::vector<PlannedTensor> planned;
  std::vector<std::vector<size_t>> groups;
  for (size_t i = 0; i < hf.size(); ++i) {
    planned.push_back(planned_tensor(hf[i].name, hf[i].dtype, hf[i].shape));
    groups.push_back({i});
  }
  // As Qwen's own checkpoints: model.safetensors-00001-of-00014.safetensors, the index only when sharded.
  ShardingOptions sharding;
  sharding.max_shard_bytes = o.max_shard_bytes;
  sharding.pattern = "model.safetensors-{:05d}-of-{:05d}.safetensors";
  sharding.index_when_single = false;
  sharding.metadata = {{"format", "pt"}};
  PD_ASSIGN_OR_RETURN(auto writer, ShardedWriter::create(o.dir, planned, groups, sharding));
  std::vector<WorkItem> items;
  uint64_t total = 0;
  for (size_t i = 0; i < hf.size(); ++i) {
    const uint64_t row_bytes = static_cast<uint64_t>(hf[i].row_elems) * dtype_size(hf[i].dtype);
    for (const WorkItem& w : split_rows(i, hf[i].rows, row_bytes)) items.push_back(w);
    total += hf[i].nbytes();
  }
  auto work = [&](const WorkItem& w, std::atomic<uint64_t>& done) {
    const HfTensor& t = hf[w.unit];
    const uint64_t row_bytes = static_cast<uint64_t>(t.row_elems) * dtype_size(t.dtype);
    std::vector<float> f;
    std::vector<uint8_t> b;
    return for_chunks(w, row_bytes, [&](int64_t r, int64_t n) -> Status {
      f.resize(static_cast<size_t>(n * t.row_elems));
      b.resize(static_cast<size_t>(n) * row_bytes);
      PD_TRY(float_elems(t, r * t.row_elems, n * t.row_elems, f.data()));
      store_floats(f.data(), f.size(), t.dtype, b.data());
      PD_TRY(writer->write(w.unit, static_cast<uint64_t>(r) * row_bytes, b.data(), b.size()));
      done.fetch_add(b.size());
      return Status::ok();
    });
  };
  PD_TRY(run_items(items, o.threads, total, o.progress, work));
  PD_TRY(writer->finish());
  sum->files = writer->files();
  sum->tensors = planned.size();
  sum->bytes = writer->file_bytes();
  return Status::ok();
}

// The MLX layout: `puredrive quantize`'s plan for the bf16 layout's listing, filled from the generators.
Status write_mlx(const SynthModel& m, const std::vector<HfTensor>& hf, const SynthWriteOptions& o,
                 std::string* config_text, SynthWriteSummary* sum) {
  std::vector<TensorInfo> infos;
  std::unordered_map<std::string, const HfTensor*> by_name;
  for (const HfTensor& t : hf) {
    TensorInfo i;
    i.name = t.name;
    i.dtype = t.dtype;
    i.shape = t.shape;
    i.nbytes = t.nbytes();
    infos.push_back(std::move(i));
    by_name[t.name] = &t;
  }
  PD_ASSIGN_OR_RETURN(TensorStore listing, TensorStore::listing(std::move(infos)));
  PD_ASSIGN_OR_RETURN(ModelConfig published, parse_model_config(m.published_config, "synthetic " + m.arch));
  PD_ASSIGN_OR_RETURN(QuantPlan plan, plan_quantization(published, listing, *m.recipe, m.group_size));
  PD_ASSIGN_OR_RETURN(*config_text, mlx_config_text(m.published_config, plan));
  sum->notices = plan.notices;
  std::vector<std::vector<size_t>> groups;
  for (const QuantJob& job : plan.jobs) groups.push_back(job.outputs);
  ShardingOptions sharding;
  sharding.max_shard_bytes = o.max_shard_bytes;
  PD_ASSIGN_OR_RETURN(auto writer, ShardedWriter::create(o.dir, plan.tensors, groups, sharding));

  // Output rows of a job run through its segments: (HF tensor, row) of output row r, rows being the plan's
  // (job.row_elems wide; a 1-D tensor is planned as one element per row).
  auto source_row = [&](const QuantJob& job, int64_t r) -> std::pair<const HfTensor*, int64_t> {
    for (const QuantJob::Segment& s : job.segments) {
      if (r < s.rows) return {by_name.at(s.tensor->name), s.first_row + r};
      r -= s.rows;
    }
    return {nullptr, 0};
  };
  auto out_row_bytes = [&](const QuantJob& job) -> uint64_t {
    if (!job.quant) return static_cast<uint64_t>(job.row_elems) * dtype_size(job.src_dtype);
    return static_cast<uint64_t>(job.row_elems * job.quant->bits / 8 +
                                 4 * (job.row_elems / job.quant->group_size));
  };
  std::vector<WorkItem> items;
  uint64_t total = 0;
  for (size_t j = 0; j < plan.jobs.size(); ++j) {
    for (const WorkItem& w : split_rows(j, plan.jobs[j].rows, out_row_bytes(plan.jobs[j])))
      items.push_back(w);
    for (size_t t : plan.jobs[j].outputs) total += plan.tensors[t].nbytes;
  }
  auto work = [&](const WorkItem& w, std::atomic<uint64_t>& done) {
    const QuantJob& job = plan.jobs[w.unit];
    const int64_t E = job.row_elems;
    std::vector<float> f;
    std::vector<uint8_t> b;
    std::vector<uint32_t> words;
    std::vector<uint16_t> scales, biases;
    return for_chunks(w, out_row_bytes(job), [&](int64_t r0, int64_t n) -> Status {
      if (job.quant) {
        const int64_t wpr = E * job.quant->bits / 32, gpr = E / job.quant->group_size;
        words.resize(static_cast<size_t>(n * wpr));
        scales.resize(static_cast<size_t>(n * gpr));
        biases.resize(scales.size());
        if (job.src_dtype != DType::kBF16) {
          return make_error(ErrorCode::kInternal, "synth --write: {} has {} scales", job.module,
                            dtype_name(job.src_dtype));
        }
        for (int64_t i = 0; i < n; ++i) {
          const auto [t, row] = source_row(job, r0 + i);
          PD_TRY(affine_rows(*t, row, 1, *job.quant, words.data() + i * wpr, scales.data() + i * gpr,
                             biases.data() + i * gpr));
        }
        PD_TRY(writer->write(job.outputs[0], static_cast<uint64_t>(r0 * wpr) * 4, words.data(),
                             words.size() * 4));
        PD_TRY(writer->write(job.outputs[1], static_cast<uint64_t>(r0 * gpr) * 2, scales.data(),
                             scales.size() * 2));
        PD_TRY(writer->write(job.outputs[2], static_cast<uint64_t>(r0 * gpr) * 2, biases.data(),
                             biases.size() * 2));
        done.fetch_add(words.size() * 4 + scales.size() * 4);
        return Status::ok();
      }
      f.resize(static_cast<size_t>(n * E));
      for (int64_t i = 0; i < n; ++i) {
        const auto [t, row] = source_row(job, r0 + i);
        PD_TRY(float_elems(*t, row * E, E, f.data() + i * E));
      }
      // Zero-centred norms as mlx-lm's sanitize stores them: 1 + w.
      if (job.add_one) {
        for (float& x : f) x += 1.0f;
      }
      const uint64_t row_bytes = static_cast<uint64_t>(E) * dtype_size(job.src_dtype);
      b.resize(static_cast<size_t>(n) * row_bytes);
      store_floats(f.data(), f.size(), job.src_dtype, b.data());
      PD_TRY(writer->write(job.outputs[0], static_cast<uint64_t>(r0) * row_bytes, b.data(), b.size()));
      done.fetch_add(b.size());
      return Status::ok();
    });
  };
  PD_TRY(run_items(items, o.threads, total, o.progress, work));
  PD_TRY(writer->finish());
  sum->files = writer->files();
  sum->tensors = plan.tensors.size();
  sum->bytes = writer->file_bytes();
  return Status::ok();
}

Status write_text(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f) return make_error(ErrorCode::kIo, "{}: write failed", path.string());
  return Status::ok();
}

// Tokenizer files and the EOS ids they imply (Qwen's <|im_end|> and <|endoftext|>); without a tokenizer the
// last id, like the golden fixtures.
Expected<std::vector<int32_t>> copy_tokenizer(const SynthModel& m, const SynthWriteOptions& o) {
  const int32_t V = m.config.vocab_size;
  if (o.tokenizer_dir.empty()) return std::vector<int32_t>{V - 1};
  PD_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(o.tokenizer_dir));
  if (tok.id_limit() > V) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: the tokenizer has ids up to {}, more than the {} rows of {}'s embedding; use an "
                      "architecture with a larger vocabulary (tiny-wide-vocab or qwen3.5-35b-a3b)",
                      o.tokenizer_dir, tok.id_limit() - 1, V, m.arch);
  }
  std::vector<int32_t> eos;
  for (const char* t : {"<|im_end|>", "<|endoftext|>"}) {
    if (std::optional<int32_t> id = tok.token_to_id(t)) eos.push_back(*id);
  }
  if (eos.empty() && tok.eos_token_id()) eos.push_back(*tok.eos_token_id());
  if (eos.empty())
    return make_error(ErrorCode::kInvalidArgument, "{}: the tokenizer has no EOS token", o.tokenizer_dir);
  std::error_code ec;
  for (const char* f :
       {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt"}) {
    const fs::path from = fs::path(o.tokenizer_dir) / f;
    if (!fs::exists(from, ec)) continue;
    fs::copy_file(from, fs::path(o.dir) / f, fs::copy_options::overwrite_existing, ec);
    if (ec) return make_error(ErrorCode::kIo, "copying {}: {}", from.string(), ec.message());
  }
  return eos;
}

}  // namespace

Expected<SynthWriteSummary> write_synth_checkpoint(const SynthModel& m, const SynthWriteOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.dir.empty()) return make_error(ErrorCode::kInvalidArgument, "synth --write needs a directory");
  std::error_code ec;
  fs::create_directories(o.dir, ec);
  if (ec) return make_error(ErrorCode::kIo, "{}: cannot create: {}", o.dir, ec.message());
  SynthWriteSummary sum;
  sum.layout = m.recipe ? "mlx" : "hf";
  PD_ASSIGN_OR_RETURN(std::vector<int32_t> eos, copy_tokenizer(m, o));
  if (!o.chat_template.empty()) {
    fs::copy_file(o.chat_template, fs::path(o.dir) / "chat_template.jinja",
                  fs::copy_options::overwrite_existing, ec);
    if (ec) return make_error(ErrorCode::kIo, "copying {}: {}", o.chat_template, ec.message());
  }
  // Qwen3.5's recommended sampling (thinking mode), with the tokenizer's end-of-turn and end-of-text ids.
  const json gen = {{"bos_token_id", eos.back()},
                    {"eos_token_id", eos},
                    {"pad_token_id", eos.back()},
                    {"do_sample", true},
                    {"temperature", 1.0},
                    {"top_k", 20},
                    {"top_p", 0.95},
                    {"transformers_version", "4.57.0.dev0"}};
  PD_TRY(write_text(fs::path(o.dir) / "generation_config.json", gen.dump(2) + "\n"));

  const std::vector<HfTensor> hf = HfListing(m).build();
  json config = json::parse(m.published_config);
  config["text_config"]["eos_token_id"] = eos.front();
  std::string config_text = config.dump(2) + "\n";
  if (m.recipe) {
    PD_TRY(write_mlx(m, hf, o, &config_text, &sum));
    json q = json::parse(config_text);
    q["text_config"]["eos_token_id"] = eos.front();
    config_text = q.dump(4) + "\n";
  } else {
    PD_TRY(write_hf(hf, o, &sum));
  }
  PD_TRY(write_text(fs::path(o.dir) / "config.json", config_text));

  // The result must load, every tensor bound: a naming mistake shows here rather than in a benchmark.
  auto loaded = load_checkpoint(o.dir, {.load_mtp = true, .error_on_unused = true});
  if (!loaded) {
    return make_error(ErrorCode::kInternal, "the written checkpoint does not load: {}",
                      loaded.status().message());
  }
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sum;
}

}  // namespace pd::cli
