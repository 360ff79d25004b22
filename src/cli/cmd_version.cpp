// puredrive info: build configuration.
#include <fmt/format.h>

#include "cli/command.h"

namespace pd::cli {
namespace {

void setup_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Print build configuration");
  cmd->callback([] {
#ifdef PD_HAVE_CUDA
    fmt::print("puredrive 0.1.0, backends: cpu, cuda\n");
#else
    fmt::print("puredrive 0.1.0, backends: cpu\n");
#endif
  });
}

const bool registered = register_command(setup_info);

}  // namespace
}  // namespace pd::cli
