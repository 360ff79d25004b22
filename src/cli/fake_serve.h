// `serve --fake-engine`: the deterministic fake engine and frontend (src/puredrive/server/testing/) let the
// HTTP layer and its Python suite run without weights. They are test code, so only the test binary
// puredrive_fake_serve (tests/server/) links them and registers them here; in the puredrive binary no
// factory is registered and serve has no --fake-* options.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "puredrive/server/engine_port.h"
#include "puredrive/server/frontend.h"

namespace pd::cli {

struct FakeServeOptions {
  std::string model_id;
  int32_t context_size = 0;
  int32_t mtp_draft = 0;
  std::chrono::milliseconds token_delay{0};
  std::chrono::milliseconds prefill_delay{0};
};

struct FakeServed {
  std::unique_ptr<server::Engine> engine;
  server::Frontend frontend;
};

using FakeServeFactory = std::function<FakeServed(const FakeServeOptions&)>;

// Called from a static initialiser of the test binary, before main() sets up the commands.
bool register_fake_serve(FakeServeFactory factory);
// Empty unless a test binary registered one.
const FakeServeFactory& fake_serve_factory();

}  // namespace pd::cli
