// puredrive synth: builds a model with random weights and the real shapes of an architecture directly on the
// backend (on CUDA the weights are generated in device memory; no file is written), then runs a short greedy
// decode to show that the model runs and its activations stay finite. With --write DIR it writes the same
// weights as a checkpoint laid out like the published one instead (synth_checkpoint.h).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/synth_checkpoint.h"
#include "cli/synth_model.h"
#include "puredrive/backend/backend.h"
#include "puredrive/model/model.h"
#include "puredrive/util/progress.h"

namespace pd::cli {
namespace {

struct SynthArgs {
  std::string arch = "qwen3.5-35b-a3b";
  std::string quant = "bf16";
  uint64_t seed = 0;
  std::string backend = "cuda";
  int threads = 0;
  int tokens = 8;
  int prompt = 16;
  bool json = false;
  int layers = 0;
  std::string write;
  std::string tokenizer;
  std::string chat_template;
  double max_shard_mb = 5 * 1024;
  bool quiet = false;
};

[[noreturn]] void fail(const Status& s) {
  fmt::print(stderr, "puredrive synth: {}\n", s.message());
  throw CLI::RuntimeError(1);
}

void run_write(const SynthArgs& a) {
  Expected<std::unique_ptr<SynthModel>> sm = make_synth_model(a.arch, a.quant, a.seed, false, a.layers);
  if (!sm) fail(sm.status());
  Expected<SynthWriteSummary> sum =
      write_synth_checkpoint(**sm, {.dir = a.write,
                                    .tokenizer_dir = a.tokenizer,
                                    .chat_template = a.chat_template,
                                    .threads = a.threads,
                                    .max_shard_bytes = static_cast<uint64_t>(a.max_shard_mb * 1048576.0),
                                    .progress = !a.quiet});
  if (!sum) fail(sum.status());
  for (const auto& n : sum->notices) fmt::print(stderr, "note: {}\n", n);
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  const double rss = static_cast<double>(u.ru_maxrss) * 1024.0;  // Linux reports KiB
  if (a.json) {
    const nlohmann::json j = {{"arch", a.arch},          {"quant", a.quant},      {"seed", a.seed},
                              {"dir", a.write},          {"layout", sum->layout}, {"files", sum->files},
                              {"tensors", sum->tensors}, {"bytes", sum->bytes},   {"seconds", sum->seconds},
                              {"peak_rss_bytes", rss}};
    fmt::print("{}\n", j.dump());
    return;
  }
  fmt::print(
      "synthetic {} ({}, seed {}) written to {} in the {} layout: {} tensors, {} in {} file(s), {:.1f} s "
      "({}/s), peak resident memory {}\n",
      a.arch, a.quant, a.seed, a.write, sum->layout == "hf" ? "Hugging Face" : "mlx-lm", sum->tensors,
      format_gb(static_cast<double>(sum->bytes)), sum->files.size(), sum->seconds,
      format_gb(static_cast<double>(sum->bytes) / std::max(sum->seconds, 1e-9)), format_gb(rss));
}

void run_synth(const SynthArgs& a) {
  if (!a.write.empty()) return run_write(a);
  if (!a.tokenizer.empty() || !a.chat_template.empty()) {
    fail(make_error(ErrorCode::kInvalidArgument, "--tokenizer and --chat-template go with --write DIR"));
  }
  using Clock = std::chrono::steady_clock;
  Expected<std::unique_ptr<Backend>> backend = create_backend({.name = a.backend, .threads = a.threads});
  if (!backend) fail(backend.status());
  Backend& be = **backend;
  const auto t0 = Clock::now();
  Expected<std::unique_ptr<SynthModel>> sm =
      make_synth_model(a.arch, a.quant, a.seed, be.device() == Device::kCpu, a.layers);
  if (!sm) fail(sm.status());
  Expected<std::unique_ptr<Model>> model = create_model((*sm)->config, (*sm)->weights, be, {.max_rows = 8});
  if (!model) fail(model.status());
  if (Status s = be.synchronize(); !s) fail(s);
  const double build_s = std::chrono::duration<double>(Clock::now() - t0).count();

  Model& m = **model;
  const int V = (*sm)->config.vocab_size;
  Expected<SequenceState> st =
      m.new_state({.ctx_size = a.prompt + a.tokens + 8, .kv_dtype = DType::kBF16, .max_rows = 8});
  if (!st) fail(st.status());
  const std::vector<int32_t> prompt = synth_tokens(a.seed, V, a.prompt);
  Expected<Buffer> id = be.alloc(DType::kI32, 1, 1);
  if (!id) fail(id.status());
  Tensor logits;
  for (size_t begin = 0; begin < prompt.size(); begin += 8) {
    const size_t n = std::min<size_t>(8, prompt.size() - begin);
    std::vector<int32_t> pos(n);
    for (size_t i = 0; i < n; ++i) pos[i] = st->length() + static_cast<int32_t>(i);
    Expected<StepOutput> o = m.forward(*st, std::span(prompt).subspan(begin, n), pos,
                                       {.logits = LogitRows::kLast, .tap = {}, .prefill = true});
    if (!o) fail(o.status());
    logits = o->logits;
  }
  std::vector<int32_t> out;
  bool finite = true;
  const auto t1 = Clock::now();
  for (int i = 0; i < a.tokens; ++i) {
    std::vector<float> host(static_cast<size_t>(V));
    if (Status s = be.download(host.data(), logits); !s) fail(s);
    for (float x : host) finite = finite && std::isfinite(x);
    if (Status s = be.argmax({.x = logits, .out = id->tensor()}); !s) fail(s);
    int32_t tok = 0;
    if (Status s = be.download(&tok, id->tensor()); !s) fail(s);
    out.push_back(tok);
    const int32_t at = st->length();
    if (Status s = be.begin_step(); !s) fail(s);
    Expected<StepOutput> o =
        m.forward(*st, std::span(&tok, 1), std::span(&at, 1), {.logits = LogitRows::kLast, .tap = {}});
    if (Status s = be.end_step(); !s) fail(s);
    if (!o) fail(o.status());
    logits = o->logits;
  }
  if (Status s = be.synchronize(); !s) fail(s);
  const double decode_s = std::chrono::duration<double>(Clock::now() - t1).count();
  if (a.json) {
    const nlohmann::json j = {{"arch", a.arch},
                              {"quant", a.quant},
                              {"seed", a.seed},
                              {"backend", be.name()},
                              {"weight_bytes", (*sm)->weight_bytes},
                              {"bound_bytes", be.bound_bytes()},
                              {"build_seconds", build_s},
                              {"prompt", prompt},
                              {"tokens", out},
                              {"logits_finite", finite},
                              {"decode_seconds", decode_s}};
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("synthetic {} ({}, seed {}) on {}: {:.2f} GB of weights bound in {:.1f} s\n", a.arch, a.quant,
               a.seed, be.name(), static_cast<double>(be.bound_bytes()) / 1e9, build_s);
    fmt::print("greedy tokens after a {}-token random prompt: {}\n", a.prompt, fmt::join(out, " "));
    fmt::print("logits finite: {}; {} decode steps (with a logits download each) in {:.3f} s\n",
               finite ? "yes" : "NO", a.tokens, decode_s);
  }
  if (!finite) fail(make_error(ErrorCode::kInternal, "non-finite logits from the synthetic model"));
}

void setup_synth(CLI::App& app) {
  auto args = std::make_shared<SynthArgs>();
  auto* cmd =
      app.add_subcommand("synth", "Build a random-weight model with real shapes on the backend and run it");
  cmd->add_option("--arch", args->arch, "Architecture")->check(CLI::IsMember(synth_archs()));
  cmd->add_option("--quant", args->quant, "Weight format")->check(CLI::IsMember(synth_quants()));
  cmd->add_option("--seed", args->seed, "Random seed");
  cmd->add_option("--layers", args->layers, "Keep only the first N decoder layers (0: all)")
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--backend", args->backend, "cuda or cpu (cpu: only small architectures fit)");
  cmd->add_option("--threads", args->threads, "CPU threads, also of --write (0: all cores)")
      ->check(CLI::Range(0, 1024));
  cmd->add_option("-n,--tokens", args->tokens, "Greedy tokens to decode")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--prompt", args->prompt, "Random prompt tokens")->check(CLI::Range(1, 1 << 16));
  cmd->add_flag("--json", args->json, "Print the result as JSON");
  cmd->add_option(
      "--write", args->write,
      "Write the weights as a checkpoint laid out like the published one to this directory (bf16: "
      "Hugging Face layout; q8/q6/q4/oq6e: mlx-lm layout) instead of running them");
  cmd->add_option("--tokenizer", args->tokenizer,
                  "With --write: copy tokenizer.json and tokenizer_config.json from this directory (e.g. "
                  "build/default/test-data/qwen3)");
  cmd->add_option("--chat-template", args->chat_template,
                  "With --write: a Jinja chat template written as chat_template.jinja (e.g. "
                  "tests/data/templates/Qwen3.5-4B.jinja)");
  cmd->add_option("--max-shard-mb", args->max_shard_mb, "With --write: the largest shard in MiB")
      ->check(CLI::Range(0.01, 1048576.0))
      ->capture_default_str();
  cmd->add_flag("-q,--quiet", args->quiet, "With --write: no progress line");
  cmd->callback([args] { run_synth(*args); });
}

const bool registered = register_command(setup_synth);

}  // namespace
}  // namespace pd::cli
