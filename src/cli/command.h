// Subcommand registry: each cmd_*.cpp registers itself, so adding a command touches one file.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace pd::cli {

// setup adds a subcommand to the app and sets its callback. A callback signals failure by throwing
// CLI::RuntimeError(exit_code) after printing its message.
using CommandSetup = std::function<void(CLI::App& app)>;

bool register_command(CommandSetup setup);

// The MTP head's draft-side options (ModelOptions::mtp_draft_vocab, mtp_window; docs/DESIGN.md §4.8),
// the same flags for generate, serve, check and bench.
inline void add_draft_options(CLI::App* cmd, int* draft_vocab, int* window) {
  cmd->add_option(
         "--mtp-draft-vocab", *draft_vocab,
         "The MTP head's lm_head over token ids [0, N) only: cheaper drafts, the same output (0: all)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--mtp-window", *window,
                  "The MTP head attends its last W positions only (CPU backend; the same output; 0: all)")
      ->check(CLI::Range(0, 1 << 24));
}

// --mtp-adaptive (DecodeRequest::adaptive_draft), for generate, serve and bench --model.
inline void add_adaptive_option(CLI::App* cmd, bool* adaptive) {
  cmd->add_option("--mtp-adaptive", *adaptive,
                  "on: draft 0..--mtp-draft tokens per step, as the request's acceptance and step times say "
                  "pays best; off: always --mtp-draft (the same output either way)")
      ->capture_default_str();
}

}  // namespace pd::cli
