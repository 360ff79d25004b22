// puredrive: the command-line entry point. Subcommands live in cmd_*.cpp and register themselves.
#include <cstdio>
#include <vector>

#include "cli/command.h"

namespace pd::cli {

static std::vector<CommandSetup>& registry() {
  static std::vector<CommandSetup> r;
  return r;
}

bool register_command(CommandSetup setup) {
  registry().push_back(std::move(setup));
  return true;
}

}  // namespace pd::cli

int main(int argc, char** argv) {
  CLI::App app{"PureDrive: exact, fast single-stream decoding of MoE LLMs with an MTP head"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "puredrive 0.1.0");
  for (auto& setup : pd::cli::registry()) setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return 0;
}
