#include "puredrive/model/quantize.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "puredrive/checkpoint/affine.h"
#include "puredrive/checkpoint/tensor_names.h"
#include "puredrive/model/loader.h"
#include "puredrive/util/mapped_file.h"
#include "puredrive/util/parallel_jobs.h"

namespace pd {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

bool is_float(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16;
}

void store_float(uint8_t* p, DType t, int64_t i, float v) {
  if (t == DType::kF32) {
    std::memcpy(p + 4 * i, &v, 4);
  } else {
    const uint16_t h = t == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
    std::memcpy(p + 2 * i, &h, 2);
  }
}

// Zero-centred norms (spec §3), the ones mlx-lm's sanitize shifts, plus the MTP head's own.
bool is_zero_centred_norm(const std::string& cname) {
  static const char* const kSuffixes[] = {".input_layernorm.weight", ".post_attention_layernorm.weight",
                                          ".q_norm.weight", ".k_norm.weight"};
  if (cname == "model.norm.weight" || cname == "mtp.norm.weight" ||
      cname == "mtp.pre_fc_norm_embedding.weight" || cname == "mtp.pre_fc_norm_hidden.weight") {
    return true;
  }
  for (const char* s : kSuffixes) {
    if (cname.ends_with(s)) return true;
  }
  return false;
}

// Output spelling of canonical names: mlx-lm's qwen3_5_moe model nests the text model under `language_model`;
// the MTP head goes next to it, where the loader (and the qwen35-mlx-q fixture) expects it.
std::string output_name(const std::string& cname, bool nested) {
  return nested ? "language_model." + cname : cname;
}

// `<p>.mlp.experts.<e>.<gate|up|down>_proj.weight` -> (`<p>.mlp.`, e, proj).
struct PerExpertName {
  std::string mlp;
  int64_t expert = 0;
  std::string proj;
};

std::optional<PerExpertName> parse_per_expert(const std::string& cname) {
  static const std::string kMid = ".mlp.experts.";
  const size_t at = cname.find(kMid);
  if (at == std::string::npos || !cname.ends_with(".weight")) return std::nullopt;
  const size_t digits = at + kMid.size();
  size_t end = digits;
  while (end < cname.size() && cname[end] >= '0' && cname[end] <= '9') ++end;
  if (end == digits || end - digits > 9 || end >= cname.size() || cname[end] != '.') return std::nullopt;
  const std::string proj = cname.substr(end + 1, cname.size() - end - 1 - std::strlen(".weight"));
  if (proj != "gate_proj" && proj != "up_proj" && proj != "down_proj") return std::nullopt;
  return PerExpertName{cname.substr(0, at + std::strlen(".mlp.")),
                       std::stoll(cname.substr(digits, end - digits)), proj};
}

struct PlanBuilder {
  const ModelConfig& c;
  const TensorStore& store;
  QuantRecipe recipe;
  int group_size;
  QuantPlan plan;
  bool nested = false;
  bool main_shifted = false;
  bool mtp_shifted = false;
  std::map<std::string, const TensorInfo*, decltype(&natural_less)> by_cname{&natural_less};

  void add_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape, QuantJob* job) {
    job->outputs.push_back(plan.tensors.size());
    plan.tensors.push_back(planned_tensor(name, dtype, std::move(shape)));
  }

  // A matrix module: source rows (segments) of width `cols`, written as `out_module` with shape
  // [lead..., rows_per_lead, cols].
  Status add_matrix(const std::string& cmodule, std::vector<QuantJob::Segment> segs,
                    std::vector<int64_t> shape, DType dtype) {
    QuantJob job;
    const std::string out_module = output_name(cmodule, nested);
    job.module = out_module;
    job.cls = classify_module(cmodule);
    job.segments = std::move(segs);
    job.row_elems = shape.back();
    job.src_dtype = dtype;
    for (const auto& s : job.segments) job.rows += s.rows;
    const int64_t cols = shape.back();
    std::optional<QuantParams> q;
    if (job.cls != ModuleClass::kOther) {
      const QuantParams p = recipe_params(recipe, group_size, job.cls);
      q = module_quant_params(recipe, group_size, job.cls, cols);
      if (!q) {
        plan.notices.push_back(
            fmt::format("{}: input width {} is not a multiple of the group size {}; kept as {}", out_module,
                        cols, cols % group_size != 0 ? group_size : p.group_size, dtype_name(dtype)));
      }
    }
    job.quant = q;
    if (q) {
      // mlx-lm records every module its quant_predicate answers with a dict: the router rule always, and the
      // recipe's per-class widths where they differ from the global ones.
      const QuantParams g = recipe_global(recipe, group_size);
      if (job.cls == ModuleClass::kRouter || q->bits != g.bits || q->group_size != g.group_size) {
        plan.overrides[out_module] = *q;
      }
      std::vector<int64_t> wshape = shape;
      wshape.back() = cols * q->bits / 32;
      std::vector<int64_t> sshape = shape;
      sshape.back() = cols / q->group_size;
      add_tensor(out_module + ".weight", DType::kU32, wshape, &job);
      add_tensor(out_module + ".scales", dtype, sshape, &job);
      add_tensor(out_module + ".biases", dtype, sshape, &job);
    } else {
      add_tensor(out_module + ".weight", dtype, shape, &job);
    }
    plan.jobs.push_back(std::move(job));
    return Status::ok();
  }

  Status add_copy(const std::string& cname, const TensorInfo* t) {
    QuantJob job;
    job.module = output_name(cname, nested);
    job.src_dtype = t->dtype;
    const int64_t n = t->numel();
    job.rows = t->shape.empty() ? 1 : std::max<int64_t>(t->shape[0], 1);
    job.row_elems = n == 0 ? 0 : n / job.rows;
    job.segments.push_back({t, 0, job.rows});
    std::vector<int64_t> shape = t->shape;
    if (cname.ends_with(".conv1d.weight") && shape.size() == 3 && shape[1] == 1 && shape[2] != 1) {
      // HF [C, 1, K] -> MLX [C, K, 1]: the same bytes, since the moved axis has length 1.
      shape = {shape[0], shape[2], 1};
    }
    if (is_zero_centred_norm(cname) && shape.size() == 1) {
      const bool shifted = cname.starts_with("mtp.") ? mtp_shifted : main_shifted;
      job.add_one = !shifted;
    }
    add_tensor(job.module, t->dtype, shape, &job);
    plan.jobs.push_back(std::move(job));
    return Status::ok();
  }

  Status check_float(const TensorInfo* t) const {
    if (!is_float(t->dtype)) {
      return make_error(ErrorCode::kUnsupported,
                        "tensor '{}' has dtype {}: quantize needs a float checkpoint (F32, BF16 or F16)",
                        t->name, dtype_name(t->dtype));
    }
    return Status::ok();
  }

  Status run() {
    nested = c.model_type == "qwen3_5_moe";
    size_t vision = 0;
    for (const auto& t : store.tensors()) {
      plan.input_bytes += t.nbytes;
      const NamePrefix* r = match_name_prefix(t.name);
      if (r != nullptr && r->canonical == nullptr) {
        ++vision;
        continue;
      }
      if (t.name.ends_with(".scales") || t.name.ends_with(".biases") || t.dtype == DType::kU32) {
        return make_error(
            ErrorCode::kUnsupported,
            "tensor '{}': the checkpoint is already quantized; quantize needs a float checkpoint", t.name);
      }
      by_cname.emplace(canonical_tensor_name(t.name), &t);
    }
    if (vision > 0) {
      plan.notices.push_back(
          fmt::format("skipped {} vision-tower tensors (mlx-lm's text model drops them too)", vision));
    }
    // Same rule as the loader: MLX-sanitized files store conv1d as [C, K, 1] and experts as switch_mlp.
    main_shifted = by_cname.count("model.layers.0.mlp.switch_mlp.gate_proj.weight") > 0;
    for (const auto& [name, t] : by_cname) {
      if (name.ends_with(".conv1d.weight") && name.starts_with("model.") && t->shape.size() == 3 &&
          t->shape[1] != t->shape[2]) {
        main_shifted = t->shape[2] == 1;
        break;
      }
    }
    mtp_shifted = by_cname.count("mtp.layers.0.mlp.switch_mlp.gate_proj.weight") > 0;

    // Per-expert tensors are stacked: prefix + kind -> expert index -> tensor.
    std::map<std::string, std::map<int64_t, const TensorInfo*>, decltype(&natural_less)> per_expert{
        &natural_less};
    for (const auto& [cname, t] : by_cname) {
      if (auto pe = parse_per_expert(cname)) {
        PD_TRY(check_float(t));
        per_expert[pe->mlp + "switch_mlp." + pe->proj][pe->expert] = t;
        continue;
      }
      if (cname == "lm_head.weight" && c.tie_word_embeddings) {
        plan.notices.push_back("lm_head.weight dropped: tie_word_embeddings is true (mlx-lm drops it too)");
        continue;
      }
      if (cname.ends_with(".mlp.experts.gate_up_proj") || cname.ends_with(".mlp.experts.down_proj")) {
        PD_TRY(check_float(t));
        if (t->shape.size() != 3) {
          return make_error(ErrorCode::kInvalidArgument, "tensor '{}': fused experts must be 3-D, found {}",
                            t->name, t->shape_string());
        }
        const std::string p = cname.substr(0, cname.size() - std::strlen("experts.gate_up_proj"));
        const int64_t E = t->shape[0], R = t->shape[1], C = t->shape[2];
        if (cname.ends_with("down_proj")) {
          PD_TRY(add_matrix(
              cname.substr(0, cname.size() - std::strlen("experts.down_proj")) + "switch_mlp.down_proj",
              {{t, 0, E * R}}, {E, R, C}, t->dtype));
          continue;
        }
        if (R % 2 != 0) {
          return make_error(ErrorCode::kInvalidArgument, "tensor '{}': gate_up rows {} are not even", t->name,
                            R);
        }
        // Gate rows first, as mlx-lm's qwen3_5_moe sanitize splits them.
        for (int half = 0; half < 2; ++half) {
          std::vector<QuantJob::Segment> segs;
          for (int64_t e = 0; e < E; ++e) segs.push_back({t, e * R + half * (R / 2), R / 2});
          PD_TRY(add_matrix(p + (half == 0 ? "switch_mlp.gate_proj" : "switch_mlp.up_proj"), std::move(segs),
                            {E, R / 2, C}, t->dtype));
        }
        continue;
      }
      PD_TRY(check_float(t));
      const std::string module = cname.ends_with(".weight") ? cname.substr(0, cname.size() - 7) : cname;
      if (cname.ends_with(".weight") && t->shape.size() >= 2 &&
          classify_module(module) != ModuleClass::kOther) {
        const int64_t rows = t->numel() / t->shape.back();
        PD_TRY(add_matrix(module, {{t, 0, rows}}, t->shape, t->dtype));
      } else {
        PD_TRY(add_copy(cname, t));
      }
    }
    for (const auto& [module, experts] : per_expert) {
      const TensorInfo* first = experts.begin()->second;
      const int64_t E = static_cast<int64_t>(experts.size());
      if (experts.begin()->first != 0 || experts.rbegin()->first != E - 1) {
        return make_error(ErrorCode::kInvalidArgument, "'{}': per-expert tensors are not numbered 0..{}",
                          module, E - 1);
      }
      if (first->shape.size() != 2) {
        return make_error(ErrorCode::kInvalidArgument, "tensor '{}': expert weights must be 2-D, found {}",
                          first->name, first->shape_string());
      }
      std::vector<QuantJob::Segment> segs;
      for (const auto& [e, t] : experts) {
        if (t->shape != first->shape || t->dtype != first->dtype) {
          return make_error(ErrorCode::kInvalidArgument, "tensor '{}' is {} {}, but '{}' is {} {}", t->name,
                            dtype_name(t->dtype), t->shape_string(), first->name, dtype_name(first->dtype),
                            first->shape_string());
        }
        segs.push_back({t, 0, t->shape[0]});
      }
      PD_TRY(add_matrix(module, std::move(segs), {E, first->shape[0], first->shape[1]}, first->dtype));
    }
    plan.global = recipe_global(recipe, group_size);
    return Status::ok();
  }
};

// Drops pages of the mapped input that have been consumed from this process, so that resident memory stays at
// the chunks in flight rather than growing to the whole checkpoint (the pages stay in the page cache).
void release_pages(const uint8_t* p, uint64_t n) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

class Executor {
 public:
  explicit Executor(ShardedWriter& out) : out_(out) {}

  Status run_job(const QuantJob& job) { return job.quant ? quantize_job(job) : copy_job(job); }

 private:
  // Output chunks are kept to a few MB per thread.
  static constexpr uint64_t kChunkBytes = 4u << 20;

  template <typename F>
  Status for_each_row_chunk(const QuantJob& job, uint64_t row_bytes, F&& fn) {
    const int64_t chunk =
        std::max<int64_t>(1, static_cast<int64_t>(kChunkBytes / std::max<uint64_t>(row_bytes, 1)));
    int64_t out_row = 0;
    for (const auto& seg : job.segments) {
      const uint64_t src_row_bytes = static_cast<uint64_t>(job.row_elems) * dtype_size(seg.tensor->dtype);
      for (int64_t r = 0; r < seg.rows; r += chunk) {
        const int64_t n = std::min(chunk, seg.rows - r);
        const uint8_t* src = seg.tensor->data + static_cast<uint64_t>(seg.first_row + r) * src_row_bytes;
        PD_TRY(fn(src, out_row, n));
        release_pages(src, static_cast<uint64_t>(n) * src_row_bytes);
        out_row += n;
      }
    }
    for (const auto& seg : job.segments) release_pages(seg.tensor->data, seg.tensor->nbytes);
    return Status::ok();
  }

  Status write(size_t tensor, uint64_t byte_offset, const void* data, size_t n) {
    return out_.write(tensor, byte_offset, data, n);
  }

  Status copy_job(const QuantJob& job) {
    const size_t out = job.outputs[0];
    const uint64_t row_bytes = static_cast<uint64_t>(job.row_elems) * dtype_size(job.src_dtype);
    std::vector<uint8_t> buf;
    return for_each_row_chunk(job, row_bytes, [&](const uint8_t* src, int64_t row, int64_t n) -> Status {
      const size_t bytes = static_cast<size_t>(n) * row_bytes;
      if (!job.add_one) return write(out, static_cast<uint64_t>(row) * row_bytes, src, bytes);
      buf.resize(bytes);
      // 1 + w rounded once to the stored dtype, as mlx-lm's `v + 1.0` computes it.
      const int64_t elems = n * job.row_elems;
      for (int64_t i = 0; i < elems; ++i)
        store_float(buf.data(), job.src_dtype, i, 1.0f + load_scale(src, job.src_dtype, i));
      return write(out, static_cast<uint64_t>(row) * row_bytes, buf.data(), bytes);
    });
  }

  Status quantize_job(const QuantJob& job) {
    const int bits = job.quant->bits, gs = job.quant->group_size;
    const int64_t cols = job.row_elems;
    const int64_t words = affine_packed_cols(cols, bits);
    const uint64_t sbytes = static_cast<uint64_t>(cols / gs) * dtype_size(job.src_dtype);
    std::vector<float> row(static_cast<size_t>(cols));
    std::vector<uint32_t> codes;
    std::vector<uint8_t> scales, biases;
    return for_each_row_chunk(
        job, static_cast<uint64_t>(cols) * 4, [&](const uint8_t* src, int64_t r0, int64_t n) -> Status {
          codes.assign(static_cast<size_t>(n * words), 0u);
          scales.assign(static_cast<size_t>(n) * sbytes, 0);
          biases.assign(scales.size(), 0);
          const uint64_t src_row_bytes = static_cast<uint64_t>(cols) * dtype_size(job.src_dtype);
          for (int64_t r = 0; r < n; ++r) {
            const uint8_t* s = src + static_cast<uint64_t>(r) * src_row_bytes;
            for (int64_t j = 0; j < cols; ++j) {
              row[static_cast<size_t>(j)] = load_scale(s, job.src_dtype, j);
              if (!std::isfinite(row[static_cast<size_t>(j)])) {
                return make_error(ErrorCode::kInvalidArgument,
                                  "'{}': row {} holds a non-finite value ({}) at column {}", job.module,
                                  r0 + r, row[static_cast<size_t>(j)], j);
              }
            }
            quantize_affine_mlx_row(row.data(), cols, bits, gs, job.src_dtype, codes.data() + r * words,
                                    scales.data() + r * sbytes, biases.data() + r * sbytes);
          }
          PD_TRY(
              write(job.outputs[0], static_cast<uint64_t>(r0 * words) * 4, codes.data(), codes.size() * 4));
          PD_TRY(write(job.outputs[1], static_cast<uint64_t>(r0) * sbytes, scales.data(), scales.size()));
          return write(job.outputs[2], static_cast<uint64_t>(r0) * sbytes, biases.data(), biases.size());
        });
  }

  ShardedWriter& out_;
};

uint64_t job_input_bytes(const QuantJob& job) {
  uint64_t n = 0;
  for (const auto& s : job.segments)
    n += static_cast<uint64_t>(s.rows * job.row_elems) * dtype_size(s.tensor->dtype);
  return n;
}

Status write_text(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return make_error(ErrorCode::kIo, "{}: cannot create", path.string());
  f << text;
  f.close();
  if (!f) return make_error(ErrorCode::kIo, "{}: write failed", path.string());
  return Status::ok();
}

json quant_block(const QuantPlan& plan) {
  json q = {{"group_size", plan.global.group_size}, {"bits", plan.global.bits}, {"mode", "affine"}};
  for (const auto& [module, p] : plan.overrides) q[module] = {{"group_size", p.group_size}, {"bits", p.bits}};
  return q;
}

// Files a model directory carries besides config and weights that a runtime needs.
const char* const kCopiedFiles[] = {"tokenizer.json",
                                    "tokenizer_config.json",
                                    "generation_config.json",
                                    "special_tokens_map.json",
                                    "chat_template.jinja",
                                    "chat_template.json",
                                    "vocab.json",
                                    "merges.txt",
                                    "added_tokens.json"};

}  // namespace

Expected<QuantPlan> plan_quantization(const ModelConfig& config, const TensorStore& store, QuantRecipe recipe,
                                      int group_size) {
  if (group_size != 32 && group_size != 64 && group_size != 128) {
    return make_error(ErrorCode::kInvalidArgument, "group size {} is not 32, 64 or 128", group_size);
  }
  if (config.quantization) {
    return make_error(ErrorCode::kUnsupported,
                      "config.json already has a quantization block; quantize needs a float checkpoint");
  }
  PlanBuilder b{config, store, recipe, recipe == QuantRecipe::kOq6e ? 64 : group_size, {}};
  PD_TRY(b.run());
  return std::move(b.plan);
}

Expected<std::string> mlx_config_text(const std::string& input_config, const QuantPlan& plan) {
  json cfg = json::parse(input_config, nullptr, false);
  if (cfg.is_discarded() || !cfg.is_object())
    return make_error(ErrorCode::kInvalidArgument, "not a JSON object");
  // mlx-lm drops vision_config, since the tower is not written, and repeats the block as quantization_config.
  cfg.erase("vision_config");
  cfg["quantization"] = quant_block(plan);
  cfg["quantization_config"] = cfg["quantization"];
  return cfg.dump(4) + "\n";
}

Expected<QuantizeSummary> quantize_checkpoint(const QuantizeOptions& o) {
  const fs::path in(o.model_dir), out(o.out_dir);
  std::error_code ec;
  if (fs::exists(out, ec) && fs::equivalent(in, out, ec)) {
    return make_error(ErrorCode::kInvalidArgument, "--out must differ from --model ({})", o.out_dir);
  }
  PD_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(o.model_dir));
  // The loader binds the input first: a checkpoint it cannot run is refused before anything is written.
  PD_ASSIGN_OR_RETURN(TensorStore store, TensorStore::open_dir(o.model_dir));
  {
    PD_ASSIGN_OR_RETURN(TensorStore check_store, TensorStore::open_dir(o.model_dir));
    auto bound = bind_checkpoint(config, std::move(check_store));
    if (!bound) return make_error(bound.status().code(), "input: {}", bound.status().message());
  }
  PD_ASSIGN_OR_RETURN(QuantPlan plan, plan_quantization(config, store, o.recipe, o.group_size));
  std::vector<std::vector<size_t>> groups;
  for (const auto& job : plan.jobs) groups.push_back(job.outputs);
  ShardingOptions sharding;
  sharding.max_shard_bytes = o.max_shard_bytes;
  PD_ASSIGN_OR_RETURN(std::unique_ptr<ShardedWriter> writer,
                      ShardedWriter::create(o.out_dir, plan.tensors, groups, sharding));

  // Largest jobs first, so that the last thread to finish is not the one that picked up the embedding.
  std::vector<size_t> order(plan.jobs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return job_input_bytes(plan.jobs[a]) > job_input_bytes(plan.jobs[b]);
  });
  Executor exec(*writer);
  // Progress counts the input the jobs read (the vision tower and a tied lm_head are not read).
  uint64_t bytes_total = 0;
  for (const auto& j : plan.jobs) bytes_total += job_input_bytes(j);
  std::atomic<size_t> done{0};
  std::atomic<uint64_t> bytes_done{0};
  const int threads = resolve_thread_count(o.threads);
  const Status ran = run_parallel_jobs(
      order.size(), threads,
      [&](size_t k) {
        const QuantJob& job = plan.jobs[order[k]];
        if (Status st = exec.run_job(job); !st) return st;
        bytes_done.fetch_add(job_input_bytes(job));
        done.fetch_add(1);
        return Status::ok();
      },
      [&] {
        if (o.progress) o.progress({done.load(), order.size(), bytes_done.load(), bytes_total});
      });
  PD_TRY(ran);
  PD_TRY(writer->finish());

  QuantizeSummary sum;
  sum.input_bytes = plan.input_bytes;
  sum.read_bytes = bytes_total;
  sum.threads = threads;
  sum.output_bytes = writer->file_bytes();
  sum.files = writer->files();
  sum.tensors_written = plan.tensors.size();
  for (const auto& j : plan.jobs) sum.modules_quantized += j.quant ? 1 : 0;

  // config.json: the input's, with the quantization block mlx-lm writes (and its copy under
  // quantization_config). mlx-lm also drops vision_config, since the tower is not written.
  PD_ASSIGN_OR_RETURN(std::string text, read_text_file((in / "config.json").string()));
  auto cfg = mlx_config_text(text, plan);
  if (!cfg) return make_error(cfg.status().code(), "{}/config.json: {}", o.model_dir, cfg.status().message());
  PD_TRY(write_text(out / "config.json", *cfg));
  for (const char* f : kCopiedFiles) {
    if (!fs::exists(in / f)) continue;
    fs::copy_file(in / f, out / f, fs::copy_options::overwrite_existing, ec);
    if (ec) return make_error(ErrorCode::kIo, "copying {}: {}", (in / f).string(), ec.message());
    sum.copied.push_back(f);
  }
  sum.notices = plan.notices;

  // The result must load: a plan bug shows here rather than at the user's first run.
  auto loaded = load_checkpoint(o.out_dir);
  if (!loaded) {
    return make_error(ErrorCode::kInternal, "the written checkpoint does not load: {}",
                      loaded.status().message());
  }
  return sum;
}

}  // namespace pd
