// GeneratorEngine: the server's Engine port (server/engine_port.h) over decode/'s Generator and the model's
// tokenizer. It lives with the CLI so that the server library does not depend on decode/. One request at a
// time on the scheduler's engine thread; MTP speculative decoding with the configured draft length when the
// checkpoint has an MTP head. Sampling options map one to one onto SamplingParams; a request without a seed
// draws from a fresh random stream (token-wise / block rules).
#pragma once

#include <memory>
#include <optional>
#include <random>
#include <string>

#include "puredrive/decode/generator.h"
#include "puredrive/server/engine_port.h"
#include "puredrive/tokenizer/tokenizer.h"

namespace pd::cli {

struct GeneratorEngineOptions {
  bool block_verification = true;          // false: token-wise acceptance for unseeded sampling
  std::optional<float> draft_temperature;  // MTP draft temperature (draft side only)
  bool adaptive_draft = true;              // DecodeRequest::adaptive_draft
};

class GeneratorEngine final : public server::Engine {
 public:
  // Owns the generator; its model, backend and weights must outlive the engine. mtp_draft is the draft
  // length k per cycle, clamped to 0..generator->options().max_draft (0 without an MTP head: plain
  // decoding). info is returned by info() as given.
  GeneratorEngine(std::unique_ptr<Generator> generator, Tokenizer tokenizer, server::EngineInfo info,
                  int mtp_draft, GeneratorEngineOptions options = {});

  server::EngineInfo info() const override { return info_; }
  server::GenerationResult generate(const server::GenerationRequest& request,
                                    server::GenerationSink& sink) override;

 private:
  std::unique_ptr<Generator> generator_;
  Tokenizer tokenizer_;
  server::EngineInfo info_;
  int mtp_draft_ = 0;
  GeneratorEngineOptions options_;
  std::mt19937_64 seeds_;
};

}  // namespace pd::cli
