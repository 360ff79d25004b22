// puredrive inspect: what a model directory holds and what running it costs. Works on a directory with only
// config.json too (plan and counts from the config), e.g. tests/fixtures/configs/qwen3.5-35b-a3b.
#include <filesystem>
#include <memory>

#include <fmt/format.h>

#include "cli/command.h"
#include "puredrive/checkpoint/safetensors.h"
#include "puredrive/model/inspect_report.h"
#include "puredrive/model/loader.h"

namespace pd::cli {
namespace {

struct InspectArgs {
  std::string model;
  int64_t ctx_size = 4096;
  bool json = false;
};

[[noreturn]] void fail(const Status& s) {
  fmt::print(stderr, "puredrive inspect: {}\n", s.message());
  throw CLI::RuntimeError(1);
}

void run_inspect(const InspectArgs& a) {
  auto config = load_model_config(a.model);
  if (!config) fail(config.status());
  InspectInput in{.dir = a.model, .config = &*config, .checkpoint = nullptr, .ctx_size = a.ctx_size};
  std::unique_ptr<Checkpoint> cp;
  auto files = find_weight_files(a.model);
  if (files) {
    auto loaded = load_checkpoint(a.model);
    if (!loaded) fail(loaded.status());
    cp = std::make_unique<Checkpoint>(std::move(loaded).value());
    in.checkpoint = cp.get();
  } else if (files.status().code() != ErrorCode::kNotFound) {
    fail(files.status());
  }
  if (a.json) {
    fmt::print("{}\n", inspect_json(in).dump(2));
  } else {
    fmt::print("{}", inspect_text(in));
  }
}

void setup_inspect(CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  auto* cmd = app.add_subcommand("inspect", "Show a model's config, tensors, formats and memory plan");
  cmd->add_option("--model", args->model, "Model directory (config.json, *.safetensors)")->required();
  cmd->add_option("--ctx-size", args->ctx_size, "Context size for the KV-cache plan")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_flag("--json", args->json, "Print JSON instead of text");
  cmd->callback([args] { run_inspect(*args); });
}

const bool registered = register_command(setup_inspect);

}  // namespace
}  // namespace pd::cli
