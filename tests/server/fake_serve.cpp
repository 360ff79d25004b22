// The test binary puredrive_fake_serve: the whole puredrive CLI plus `serve --fake-engine`, which serves the
// test-only fake engine and frontend (src/puredrive/server/testing/) for the server suite.
#include "cli/fake_serve.h"
#include "puredrive/server/testing/fake_engine.h"
#include "puredrive/server/testing/fake_frontend.h"

namespace pd::cli {
namespace {

FakeServed make_fake(const FakeServeOptions& o) {
  server::fake::FakeEngineOptions e;
  e.model_id = o.model_id;
  e.context_size = o.context_size;
  e.mtp_draft = o.mtp_draft;
  e.token_delay = o.token_delay;
  e.prefill_delay = o.prefill_delay;
  return FakeServed{std::make_unique<server::fake::FakeEngine>(e), server::fake::make_fake_frontend()};
}

const bool registered = register_fake_serve(make_fake);

}  // namespace
}  // namespace pd::cli
