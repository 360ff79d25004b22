// Subcommand registry: each cmd_*.cpp registers itself, so adding a command touches one file.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace pd::cli {

// setup adds a subcommand to the app and sets its callback. A callback signals failure by throwing
// CLI::RuntimeError(exit_code) after printing its message.
using CommandSetup = std::function<void(CLI::App& app)>;

bool register_command(CommandSetup setup);

}  // namespace pd::cli
