// TEST-ONLY engine for `serve --fake-engine` and the server tests. It "answers" the fake frontend's
// ChatML prompts with deterministic text: it echoes the last user message followed by filler words drawn
// from a PRNG (fixed for temperature 0, keyed by the seed when one is given, random otherwise), calls the
// tools the user message names (or the forced one for tool_choice required / named), reports a tool's
// result, and thinks first when the prompt opened "<think>". Bytes are tokens, so multi-byte characters
// span several tokens and exercise UTF-8 hold-back. Logprobs and MTP statistics are made up but shaped
// like real ones. Optional delays let tests catch requests mid-prefill and mid-stream.
#pragma once

#include <chrono>
#include <string>

#include "puredrive/server/engine_port.h"

namespace pd::server::fake {

struct FakeEngineOptions {
  std::string model_id = "fake";
  int32_t context_size = 4096;
  int32_t mtp_draft = 2;  // tokens per step: up to mtp_draft + 1
  std::chrono::milliseconds prefill_delay{0};
  std::chrono::milliseconds token_delay{0};  // per emitted token
  int filler_words = 24;
};

class FakeEngine final : public Engine {
 public:
  explicit FakeEngine(FakeEngineOptions options) : options_(std::move(options)) {}
  EngineInfo info() const override;
  GenerationResult generate(const GenerationRequest& request, GenerationSink& sink) override;

  // The full text the engine would produce for this request before max_tokens / context limits.
  std::string reply_for(const GenerationRequest& request) const;

 private:
  FakeEngineOptions options_;
};

}  // namespace pd::server::fake
