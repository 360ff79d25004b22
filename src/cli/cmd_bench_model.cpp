// puredrive bench --model DIR: the benchmark protocol of docs/DESIGN.md §7 on a checkpoint on disk, through
// what `serve` and `generate` run (ModelSession, Generator): per context, per mode (greedy or the model's
// default sampling, plain or MTP) and per run, a real prefill of the context's prompt and `--tokens` decoded
// tokens (EOS ignored, so that every run decodes the same count). tok/s = decoded tokens / decode wall time
// (prefill excluded and reported on its own; the generator waits for the prefill's device work, which the
// decode time would otherwise include: DecodeRequest::wait_for_prefill); the median and the spread over the
// runs per (context, mode), tokens per cycle for MTP runs, the floor (bytes one plain decode step moves at
// the context, from the memory plan, over the copy bandwidth measured in the same run), and the load time.
// The record has the same schema as `bench --synth`'s (cmd_bench.cpp).
//
// Prompts: real code text, the repository's own sources (--prompt-root, default the current directory):
// every C++, CUDA, Python, shell, CMake, Markdown and Jinja file under src/, tools/, tests/, bench/ and docs/
// in path order; run i of a cell starts at the i-th third of that list (three different prompts for three
// runs) and wraps around when the context needs more text. Cut to the exact token count.
//
// --prompt-text N prints prompt N of the first context as text (what bench/api_bench.py sends).
//
// --read-weights: only reads every tensor of the checkpoint through the reader of the GPU upload
// (util/staged_copy.h: four threads, pread into 16 MiB staging buffers) into a sink that discards it, twice
// (the second pass comes from the page cache), then once through the mapping (PD_WEIGHT_READ=mmap), and
// reports GB/s and peak resident memory: the host side of a load, measurable without a GPU.
#include <sys/resource.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/bench_common.h"
#include "puredrive/checkpoint/safetensors.h"
#include "puredrive/decode/model_session.h"
#include "puredrive/util/mapped_file.h"
#include "puredrive/util/progress.h"
#include "puredrive/util/staged_copy.h"

namespace pd::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Mode {
  std::string name;
  bool sample = false;
  bool mtp = false;
};

double peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024.0;  // Linux reports KiB
}

Expected<std::vector<Mode>> parse_modes(const std::string& text) {
  std::vector<Mode> out;
  size_t i = 0;
  while (i <= text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    const std::string m = text.substr(i, j - i);
    if (m == "greedy" || m == "greedy-mtp" || m == "sample" || m == "sample-mtp") {
      out.push_back({m, m.rfind("sample", 0) == 0, m.find("-mtp") != std::string::npos});
    } else {
      return make_error(ErrorCode::kInvalidArgument,
                        "--modes: '{}' is not one of greedy, greedy-mtp, sample, sample-mtp", m);
    }
    i = j + 1;
  }
  return out;
}

// The repository's source text, file by file in path order (see the header comment).
class PromptSet {
 public:
  static Expected<PromptSet> load(const std::string& root) {
    PromptSet p;
    static const char* const kDirs[] = {"src", "tools", "tests", "bench", "docs"};
    static const char* const kExts[] = {".cpp", ".h", ".cu", ".cuh", ".py", ".sh", ".cmake", ".md", ".jinja"};
    std::error_code ec;
    for (const char* d : kDirs) {
      const fs::path dir = fs::path(root) / d;
      if (!fs::is_directory(dir, ec)) continue;
      for (auto it = fs::recursive_directory_iterator(dir, ec); it != fs::recursive_directory_iterator();
           it.increment(ec)) {
        if (ec || !it->is_regular_file(ec)) continue;
        const fs::path& f = it->path();
        const std::string ext = f.extension().string();
        const bool text = f.filename() == "CMakeLists.txt" ||
                          std::find(std::begin(kExts), std::end(kExts), ext) != std::end(kExts);
        if (text && it->file_size(ec) < (1u << 20)) p.paths_.push_back(fs::relative(f, root, ec).string());
      }
    }
    std::sort(p.paths_.begin(), p.paths_.end());
    if (p.paths_.empty()) {
      return make_error(
          ErrorCode::kNotFound,
          "--prompt-root {}: no source files under src/, tools/, tests/, bench/ or docs/ for the "
          "prompts (run from the repository root or pass --prompt-root)",
          root);
    }
    p.root_ = root;
    return p;
  }

  // `count` tokens of prompt `index` (0, 1, 2); *wrapped: the file list was used more than once.
  Expected<std::vector<int32_t>> tokens(const Tokenizer& tok, int index, int count, bool* wrapped) const {
    std::vector<int32_t> out;
    const size_t n = paths_.size();
    const size_t start = static_cast<size_t>(index % 3) * n / 3;
    *wrapped = false;
    for (size_t k = 0; static_cast<int>(out.size()) < count; ++k) {
      if (k == n) *wrapped = true;
      if (k == 4 * n) break;
      const std::string& rel = paths_[(start + k) % n];
      PD_ASSIGN_OR_RETURN(std::string text, read_text_file((fs::path(root_) / rel).string()));
      PD_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.encode(text + "\n", false));
      out.insert(out.end(), ids.begin(), ids.end());
    }
    if (static_cast<int>(out.size()) < count) {
      return make_error(ErrorCode::kInvalidArgument, "the prompt text gives only {} tokens, fewer than {}",
                        out.size(), count);
    }
    out.resize(static_cast<size_t>(count));
    return out;
  }

  size_t size() const { return paths_.size(); }

 private:
  std::string root_;
  std::vector<std::string> paths_;
};

// A StagingTarget that keeps nothing: the reading half of an upload.
class DiscardTarget final : public StagingTarget {
 public:
  DiscardTarget(int workers, size_t chunk) : buffers_(static_cast<size_t>(workers * StagedCopier::kSlots)) {
    for (auto& b : buffers_) b.resize(chunk);
  }
  uint8_t* buffer(int w, int s) override {
    return buffers_[static_cast<size_t>(w * StagedCopier::kSlots + s)].data();
  }
  Status wait(int, int) override { return Status::ok(); }
  Status submit(int, int, void*, size_t) override { return Status::ok(); }
  Status finish() override { return Status::ok(); }

 private:
  std::vector<std::vector<uint8_t>> buffers_;
};

void run_read_weights(const BenchArgs& a) {
  TensorStore store = bench_check(TensorStore::open_dir(a.model));
  std::vector<CopyRange> ranges;
  uint64_t total = 0;
  for (const TensorInfo& t : store.tensors()) {
    // The sink never writes: dst only names the range.
    ranges.push_back({const_cast<uint8_t*>(t.data), t.data, t.nbytes});
    total += t.nbytes;
  }
  json passes = json::array();
  int workers = 0;
  size_t chunk = 0;
  // pread twice (disk or whatever the page cache holds, then the page cache), then through the mapping
  // (PD_WEIGHT_READ=mmap), so that a machine whose file system makes pread slow shows it.
  for (const auto& [pass, how] : {std::pair{0, WeightRead::kPread}, std::pair{1, WeightRead::kPread},
                                  std::pair{2, WeightRead::kMapped}}) {
    StagedCopier copier(0, 16u << 20, how);
    DiscardTarget sink(copier.workers(), copier.chunk_bytes());
    workers = copier.workers();
    chunk = copier.chunk_bytes();
    const auto t0 = Clock::now();
    bench_check(copier.copy(ranges, sink));
    const double s = seconds(t0, Clock::now());
    const char* mode = how == WeightRead::kPread ? "pread" : "mmap";
    passes.push_back({{"pass", pass},
                      {"read", mode},
                      {"seconds", s},
                      {"bytes_per_second", static_cast<double>(total) / s}});
    fmt::print(stderr, "read pass {} ({}): {} in {:.2f} s, {}/s\n", pass, mode,
               format_gb(static_cast<double>(total)), s, format_gb(static_cast<double>(total) / s));
  }
  const json out = {{"schema", "puredrive-read/1"},
                    {"date_utc", utc_now()},
                    {"commit", a.commit},
                    {"model", a.model},
                    {"weight_bytes", total},
                    {"reader", {{"threads", workers}, {"chunk_bytes", chunk}}},
                    {"passes", passes},
                    {"peak_rss_bytes", peak_rss_bytes()}};
  write_record(a.json_out, out);
  fmt::print(
      "{}: {} of weights read through the upload reader ({} threads): pread {}/s, then {}/s (page "
      "cache); through the mapping {}/s; peak resident memory {}\n",
      a.model, format_gb(static_cast<double>(total)), workers,
      format_gb(passes[0]["bytes_per_second"].get<double>()),
      format_gb(passes[1]["bytes_per_second"].get<double>()),
      format_gb(passes[2]["bytes_per_second"].get<double>()), format_gb(peak_rss_bytes()));
}

json summarize(const json& cells, const std::vector<int>& contexts, const std::vector<Mode>& modes) {
  json out = json::array();
  for (int c : contexts) {
    for (const Mode& m : modes) {
      std::vector<double> tps, prefill, tpc;
      for (const json& cell : cells) {
        if (cell["context"] != c || cell["mode"] != m.name) continue;
        tps.push_back(cell["decode_tokens_per_second"].get<double>());
        prefill.push_back(cell["prefill_tokens_per_second"].get<double>());
        if (cell.contains("tokens_per_cycle")) tpc.push_back(cell["tokens_per_cycle"].get<double>());
      }
      if (tps.empty()) continue;
      json s = {{"context", c},
                {"mode", m.name},
                {"runs", tps.size()},
                {"decode_tokens_per_second_median", median(tps)},
                {"decode_tokens_per_second_min", *std::min_element(tps.begin(), tps.end())},
                {"decode_tokens_per_second_max", *std::max_element(tps.begin(), tps.end())},
                {"prefill_tokens_per_second_median", median(prefill)}};
      if (!tpc.empty()) s["tokens_per_cycle_median"] = median(tpc);
      out.push_back(s);
    }
  }
  return out;
}

}  // namespace

void run_bench_model(const BenchArgs& a) {
  if (a.read_weights) return run_read_weights(a);
  if (a.prompt_text >= 0) {
    const Tokenizer tok = bench_check(Tokenizer::load(a.model));
    const PromptSet prompts = bench_check(PromptSet::load(a.prompt_root));
    bool wrapped = false;
    const std::vector<int32_t> ids = bench_check(
        prompts.tokens(tok, a.prompt_text, bench_check(parse_contexts(a.contexts)).front(), &wrapped));
    fmt::print("{}", tok.decode(ids));
    return;
  }
  const std::vector<int> contexts = bench_check(parse_contexts(a.contexts));
  std::vector<Mode> modes = bench_check(parse_modes(a.modes));
  const PromptSet prompts = bench_check(PromptSet::load(a.prompt_root));
  std::unique_ptr<ModelSession> s = bench_check(ModelSession::open({.model_dir = a.model,
                                                                    .backend = a.backend,
                                                                    .threads = a.threads,
                                                                    .ctx_size = a.ctx_size,
                                                                    .kv_dtype = DType::kBF16,
                                                                    .prefill_chunk = a.prefill_chunk,
                                                                    .max_draft = std::max(a.mtp_draft, 1),
                                                                    .mtp = true,
                                                                    .mtp_draft_vocab = a.mtp_draft_vocab,
                                                                    .mtp_window = a.mtp_window}));
  if (!s->tokenizer) bench_fail(make_error(ErrorCode::kNotFound, "{}: tokenizer.json is missing", a.model));
  Backend& be = *s->backend;
  json notes = json::array();
  const SamplingParams defaults = s->defaults.sampling();
  std::vector<Mode> run_modes;
  for (const Mode& m : modes) {
    if (m.mtp && !s->generator->has_drafter()) {
      notes.push_back(fmt::format("{}: the checkpoint has no MTP head", m.name));
    } else if (m.sample && defaults.is_greedy()) {
      notes.push_back(fmt::format("{}: generation_config.json asks for greedy decoding", m.name));
    } else {
      run_modes.push_back(m);
    }
  }
  const int copy_mib = a.copy_mib > 0 ? a.copy_mib : (be.device() == Device::kCuda ? 1024 : 64);
  const double bandwidth = copy_bandwidth(be, int64_t{copy_mib} << 20);
  const MemoryPlan& plan = s->plan;
  json skipped = json::array();
  std::vector<int> run_contexts;
  for (int c : contexts) {
    if (static_cast<int64_t>(c) + a.tokens + a.mtp_draft + 1 > plan.ctx_size) {
      skipped.push_back({{"context", c},
                         {"reason", fmt::format("context {} + {} tokens exceeds the session's {} tokens", c,
                                                a.tokens, plan.ctx_size)}});
    } else {
      run_contexts.push_back(c);
    }
  }
  const double weight_bytes = static_cast<double>(plan.weight_bytes);
  json out = {
      {"schema", "puredrive-bench/1"},
      {"date_utc", utc_now()},
      {"commit", a.commit},
      {"note", a.note},
      {"device", device_json(be)},
      {"model",
       {{"dir", a.model},
        {"model_type", s->checkpoint.config.model_type},
        {"expert_layout", s->checkpoint.expert_layout},
        {"quantized", s->checkpoint.config.quantization.has_value()},
        {"weight_bytes", plan.weight_bytes},
        {"bound_bytes", be.bound_bytes()},
        {"mtp_head", s->generator->has_drafter()},
        {"load",
         {{"map_seconds", s->load.map_seconds},
          {"upload_seconds", s->load.upload_seconds},
          {"total_seconds", s->load.total_seconds},
          // The CPU backend uses the mapped weights in place: there is no upload to rate.
          {"upload_bytes_per_second", be.device() == Device::kCpu
                                          ? json(nullptr)
                                          : json(weight_bytes / std::max(s->load.upload_seconds, 1e-9))}}}}},
      {"protocol",
       {{"mode", "ModelSession + Generator (as serve and generate); EOS ignored"},
        {"modes", a.modes},
        {"mtp_draft", a.mtp_draft},
        {"mtp_adaptive", a.mtp_adaptive},
        {"decode_tokens", a.tokens},
        {"runs_per_cell", a.runs},
        {"prefill", "real prefill of the repository's source text, exact token counts"},
        {"warmup", "one untimed 16-token greedy generation per greedy mode before the cells"},
        {"prompt_files", prompts.size()},
        {"prefill_chunk_rows", s->model->max_rows()},
        {"kv_dtype", "bf16"},
        {"session_ctx_size", plan.ctx_size},
        {"floor",
         "bytes per plain decode step at the context (memory plan: active weights + KV + GDN state read and "
         "written) / measured device-to-device copy bandwidth (read + write)"}}},
      {"copy_bandwidth_bytes_per_second", bandwidth},
      {"notes", notes},
      {"skipped_contexts", skipped},
      {"cells", json::array()},
      {"complete", false}};
  fmt::print(stderr, "{} loaded in {:.1f} s; copy bandwidth {}/s\n", a.model, s->load.total_seconds,
             format_gb(bandwidth));
  // Prompts are tokenized once per run index, at the longest context, and cut for the shorter ones.
  const int longest = run_contexts.empty() ? 0 : *std::max_element(run_contexts.begin(), run_contexts.end());
  std::vector<std::vector<int32_t>> prompt_ids;
  std::vector<bool> wrapped;
  for (int r = 0; r < std::min(a.runs, 3) && longest > 0; ++r) {
    bool w = false;
    prompt_ids.push_back(bench_check(prompts.tokens(*s->tokenizer, r, longest, &w)));
    wrapped.push_back(w);
  }
  // One short untimed generation per kind of step first (plain, and MTP when a mode uses it), so that
  // one-time costs (CUDA graph captures of the first steps, first touches of the weights) stay out of the
  // first cell.
  if (!run_contexts.empty()) {
    for (const Mode& m : run_modes) {
      if (m.sample || (m.mtp && !s->generator->has_drafter())) continue;
      DecodeRequest warm;
      const std::vector<int32_t>& ids = prompt_ids[0];
      warm.prompt.assign(ids.begin(), ids.begin() + std::min<size_t>(64, ids.size()));
      warm.max_tokens = 16;
      warm.num_draft = m.mtp ? a.mtp_draft : 0;
      warm.adaptive_draft = a.mtp_adaptive;
      warm.sampling.temperature = 0.0f;
      bench_check(s->generator->generate(warm));
    }
  }
  // Greedy output with MTP must equal greedy output without it (docs/DESIGN.md §4.3): checked on every
  // prompt that ran in both modes.
  std::map<std::pair<int, int>, std::vector<int32_t>> greedy_plain, greedy_mtp;
  for (int c : run_contexts) {
    const double floor_tps = bandwidth / static_cast<double>(plan.bytes_per_decode_token(c));
    for (const Mode& m : run_modes) {
      for (int run = 0; run < a.runs; ++run) {
        const std::vector<int32_t>& ids = prompt_ids[static_cast<size_t>(run % 3)];
        DecodeRequest req;
        req.prompt.assign(ids.begin(), ids.begin() + c);
        req.max_tokens = a.tokens;
        req.num_draft = m.mtp ? a.mtp_draft : 0;
        req.adaptive_draft = a.mtp_adaptive;
        // The prefill returns with its GPU work queued, and the first decode step waited for it: 141.5 tok/s
        // on the H200 (35B q8) where bench --synth gave 170.8 and the API 172.4. The wait is prefill time;
        // the CPU backend runs ops as they are called, so its times do not change.
        req.wait_for_prefill = true;
        if (m.sample) {
          req.sampling = defaults;
          req.rng_seed = static_cast<uint64_t>(run);
        } else {
          req.sampling.temperature = 0.0f;
        }
        const DecodeResult r = bench_check(s->generator->generate(req));
        const double tps = static_cast<double>(r.tokens.size()) / r.decode_seconds;
        json cell = {
            {"context", c},
            {"mode", m.name},
            {"run", run},
            {"prompt", run % 3},
            {"prompt_wrapped", static_cast<bool>(wrapped[static_cast<size_t>(run % 3)])},
            {"prefill_tokens", c},
            {"prefill_seconds", r.prefill_seconds},
            {"prefill_tokens_per_second", c / std::max(r.prefill_seconds, 1e-9)},
            {"decode_tokens", r.tokens.size()},
            {"decode_seconds", r.decode_seconds},
            {"decode_tokens_per_second", tps},
            {"target_steps", r.steps},
            {"bytes_per_step", plan.bytes_per_decode_token(c)},
            {"floor_tokens_per_second", floor_tps},
            {"fraction_of_floor", tps / floor_tps},
            {"first_tokens", std::vector<int32_t>(r.tokens.begin(),
                                                  r.tokens.begin() + std::min<size_t>(16, r.tokens.size()))}};
        if (!m.sample) (m.mtp ? greedy_mtp : greedy_plain)[{c, run}] = r.tokens;
        if (m.mtp) {
          cell["tokens_per_cycle"] = r.accept.tokens_per_cycle();
          cell["acceptance"] = r.summary();
        }
        out["cells"].push_back(cell);
        write_record(a.json_out, out);
        fmt::print(stderr, "context {} {} run {}: {:.1f} tok/s decode, prefill {:.0f} tok/s{}\n", c, m.name,
                   run, tps, c / std::max(r.prefill_seconds, 1e-9),
                   m.mtp ? fmt::format(", {:.2f} tokens/cycle", r.accept.tokens_per_cycle()) : "");
      }
    }
  }
  out["summary"] = summarize(out["cells"], run_contexts, run_modes);
  int compared = 0, identical = 0;
  for (const auto& [key, tokens] : greedy_mtp) {
    if (auto it = greedy_plain.find(key); it != greedy_plain.end()) {
      ++compared;
      identical += it->second == tokens ? 1 : 0;
    }
  }
  if (compared > 0) out["greedy_mtp_identical"] = {{"compared", compared}, {"identical", identical}};
  out["complete"] = true;
  write_record(a.json_out, out);
  if (compared > identical) {
    bench_fail(
        make_error(ErrorCode::kInternal, "greedy output with MTP differs from greedy output without it"));
  }
  fmt::print("{} on {}: loaded in {:.1f} s ({} of weights, upload {:.1f} s), copy bandwidth {}/s\n", a.model,
             be.name(), s->load.total_seconds, format_gb(weight_bytes), s->load.upload_seconds,
             format_gb(bandwidth));
  fmt::print("{:>8} {:>11} {:>5} {:>12} {:>17} {:>12} {:>10}\n", "context", "mode", "runs", "decode t/s",
             "(min..max)", "prefill t/s", "tok/cycle");
  for (const json& r : out["summary"]) {
    fmt::print("{:>8} {:>11} {:>5} {:>12.1f} {:>17} {:>12.0f} {:>10}\n", r["context"].get<int>(),
               r["mode"].get<std::string>(), r["runs"].get<int>(),
               r["decode_tokens_per_second_median"].get<double>(),
               fmt::format("({:.1f}..{:.1f})", r["decode_tokens_per_second_min"].get<double>(),
                           r["decode_tokens_per_second_max"].get<double>()),
               r["prefill_tokens_per_second_median"].get<double>(),
               r.contains("tokens_per_cycle_median")
                   ? fmt::format("{:.2f}", r["tokens_per_cycle_median"].get<double>())
                   : std::string("-"));
  }
  if (compared > 0) {
    fmt::print("greedy with MTP == greedy without: {} of {} prompts{}\n", identical, compared,
               identical == compared ? "" : "  <-- EXACTNESS FAILURE");
  }
  for (const json& sk : skipped) fmt::print("skipped: {}\n", sk["reason"].get<std::string>());
  for (const json& n : notes) fmt::print("note: {}\n", n.get<std::string>());
}

}  // namespace pd::cli
