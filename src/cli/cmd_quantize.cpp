// puredrive quantize: a float checkpoint -> an MLX affine checkpoint in mlx-lm's layout, MTP head kept.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/command.h"
#include "puredrive/model/memory_plan.h"
#include "puredrive/model/quantize.h"
#include "puredrive/util/progress.h"

namespace pd::cli {
namespace {

struct QuantizeArgs {
  std::string model;
  std::string out;
  std::string recipe;
  int group_size = 64;
  int threads = 0;
  bool quiet = false;
};

[[noreturn]] void fail(const Status& s) {
  fmt::print(stderr, "puredrive quantize: {}\n", s.message());
  throw CLI::RuntimeError(1);
}

double peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024.0;  // Linux reports KiB
}

void run_quantize(const QuantizeArgs& a) {
  auto recipe = parse_quant_recipe(a.recipe);
  if (!recipe) fail(recipe.status());
  if (*recipe == QuantRecipe::kOq6e && a.group_size != 64) {
    fail(make_error(ErrorCode::kInvalidArgument,
                    "recipe oq6e uses group size 64; --group-size {} does not apply", a.group_size));
  }
  QuantizeOptions o;
  o.model_dir = a.model;
  o.out_dir = a.out;
  o.recipe = *recipe;
  o.group_size = a.group_size;
  o.threads = a.threads;
  // A bar on a terminal, a line per tenth in a log; the total is known at the first report.
  std::optional<Progress> progress;
  if (!a.quiet) {
    o.progress = [&](const QuantizeProgress& p) {
      if (!progress) progress.emplace("quantize", p.bytes_total);
      progress->update(p.bytes_done);
    };
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto sum = quantize_checkpoint(o);
  if (progress) progress->finish();
  if (!sum) fail(sum.status());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& n : sum->notices) fmt::print(stderr, "note: {}\n", n);
  fmt::print("{} -> {} ({}): {} tensors written ({} modules quantized) in {}, {} -> {}\n", a.model, a.out,
             a.recipe, sum->tensors_written, sum->modules_quantized, fmt::join(sum->files, ", "),
             format_bytes(static_cast<double>(sum->input_bytes)),
             format_bytes(static_cast<double>(sum->output_bytes)));
  fmt::print("copied: {}\n",
             sum->copied.empty() ? std::string("none") : fmt::format("{}", fmt::join(sum->copied, ", ")));
  // One line with the figures a benchmark log keeps: exact byte counts, the rate and the peak memory.
  fmt::print(
      "time {:.1f} s on {} thread{}: {} input bytes ({} read, {}/s), {} output bytes, "
      "peak resident memory {} ({} bytes); the output loads\n",
      secs, sum->threads, sum->threads == 1 ? "" : "s", sum->input_bytes,
      format_gb(static_cast<double>(sum->read_bytes)),
      format_gb(static_cast<double>(sum->read_bytes) / std::max(secs, 1e-9)), sum->output_bytes,
      format_bytes(peak_rss_bytes()), static_cast<uint64_t>(peak_rss_bytes()));
}

void setup_quantize(CLI::App& app) {
  auto args = std::make_shared<QuantizeArgs>();
  auto* cmd = app.add_subcommand(
      "quantize",
      "Convert a float checkpoint to MLX affine (mlx-lm layout), keeping and quantizing the MTP head");
  cmd->add_option("--model", args->model, "Input model directory (config.json, *.safetensors)")->required();
  cmd->add_option("--out", args->out, "Output directory (created)")->required();
  cmd->add_option(
         "--recipe", args->recipe,
         "q8, q6, q5, q4 (every module at that width) or oq6e (routed experts 6-bit, the rest 8-bit); "
         "routers are 8-bit in all")
      ->required()
      ->check(CLI::IsMember({"q8", "q6", "q5", "q4", "oq6e"}));
  cmd->add_option("--group-size", args->group_size, "Quantization group size")
      ->check(CLI::IsMember({32, 64, 128}));
  cmd->add_option("--threads", args->threads,
                  "Worker threads (0: all cores; the output is the same for any count)")
      ->check(CLI::Range(0, 256));
  cmd->add_flag("-q,--quiet", args->quiet, "No progress line");
  cmd->callback([args] { run_quantize(*args); });
}

const bool registered = register_command(setup_quantize);

}  // namespace
}  // namespace pd::cli
