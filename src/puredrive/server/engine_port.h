// The engine port: the only view the server has of the generator (docs/ARCHITECTURE.md, "Boundaries"). Token
// ids and text go in and come out; no tensors, no devices. The Scheduler (scheduler.h) owns the single engine
// thread, the queue and cancellation, and calls Engine::generate for one request at a time on that thread.
// HTTP threads never call the engine: they wait on their request's event queue.
//
// Implementations: FakeEngine (testing/fake_engine.h, for tests and `serve --fake-engine`) and
// GeneratorEngine, the adapter over decode/'s generator (src/cli/generator_engine.h). Contract for an
// implementation:
//  - generate() runs one request to completion on the calling thread and never throws for bad input:
//    trouble comes back as FinishReason::kError with a message;
//  - it calls sink.on_output() after every step that produced tokens (an MTP cycle may produce several),
//    stops as soon as on_output() returns false or sink.cancelled() turns true (poll it between prefill
//    chunks, too), and then returns kCancelled;
//  - it stops with kStop when it samples one of request.stop_token_ids (that token is counted in
//    completion_tokens but its text is not emitted; the scheduler drops its id and logprob if the engine
//    sends them), with kLength after request.max_tokens tokens, and with kContextFull when the sequence
//    reaches the context size first;
//  - GenerationOutput::text is valid UTF-8: bytes of a character split across tokens are held back until
//    the character completes (the server JSON-encodes the text as it arrives).
// Stop strings are not part of the port: the scheduler matches them on the text and answers false from
// on_output() once one matched.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "puredrive/util/finish_reason.h"

namespace pd::server {

// Part of the port's vocabulary; shared with decode/ (util/finish_reason.h).
using pd::FinishReason;

// Validated sampling settings (request_parser.cpp checks the ranges). The adapter maps them onto the
// decode/ sampler's parameters one to one.
struct SamplingOptions {
  float temperature = 1.0f;        // 0 = greedy (ties to the lowest id)
  float top_p = 1.0f;              // (0, 1]; 1 = off
  int32_t top_k = 0;               // 0 = off
  float min_p = 0.0f;              // [0, 1]; 0 = off
  float presence_penalty = 0.0f;   // [-2, 2]: logit -= penalty once for every token id already generated
  float frequency_penalty = 0.0f;  // [-2, 2]: logit -= penalty * count of that id in the generated tokens
  std::optional<uint64_t> seed;    // set: reproducible sampling (seeded mode of docs/spec/speculative.md)
  std::vector<std::pair<int32_t, float>>
      logit_bias;  // (token id < vocab, bias in [-100, 100]) added to logits
};

struct GenerationRequest {
  std::string id;  // "chatcmpl-..." / "cmpl-...", for logs
  std::vector<int32_t> prompt_ids;
  SamplingOptions sampling;
  int32_t max_tokens = 1;               // >= 1; the server already capped it at context_size - prompt size
  std::vector<int32_t> stop_token_ids;  // end of turn / end of text ids of the model
  // -1: no logprobs. 0..20: the log-probability of each chosen token plus this many most likely
  // alternatives, from log_softmax of the raw logits (before temperature, penalties and filtering).
  int32_t logprobs = -1;
  // false: plain decoding for this request, without MTP drafts (the web page's exactness replay). The output
  // is the same either way (docs/DESIGN.md §4.3); only the speed differs.
  bool mtp = true;
};

struct TopLogprob {
  int32_t token_id = 0;
  std::string token;  // the token's bytes (may be an incomplete UTF-8 sequence)
  float logprob = 0.0f;
};

struct TokenLogprob {
  int32_t token_id = 0;
  std::string token;  // the token's bytes (may be an incomplete UTF-8 sequence)
  float logprob = 0.0f;
  std::vector<TopLogprob> top;  // most likely first; request.logprobs entries
};

// Output of one engine step: the tokens it accepted and the text they complete.
struct GenerationOutput {
  std::vector<int32_t> token_ids;
  std::string text;                    // valid UTF-8, possibly empty
  std::vector<TokenLogprob> logprobs;  // one per token id when requested, else empty
};

struct GenerationStats {
  int32_t prompt_tokens = 0;
  int32_t cached_prompt_tokens = 0;  // prompt tokens reused from a prefix cache, not recomputed
  int32_t completion_tokens = 0;     // every sampled token, including a final stop token
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;        // first token after prefill to the end
  int64_t decode_steps = 0;           // target forward passes after prefill: one per MTP cycle
  int64_t draft_tokens = 0;           // MTP tokens proposed
  int64_t accepted_draft_tokens = 0;  // MTP tokens accepted by verification
  std::vector<int64_t> proposed_at;   // [j]: MTP cycles that proposed a draft at position j (0-based)
  std::vector<int64_t> accepted_at;   // [j]: cycles whose draft at position j was accepted

  // Tokens after the first (which comes out of the prefill) per second of decoding; 0 without any.
  double decode_tokens_per_second() const {
    return decode_seconds > 0 && completion_tokens > 1 ? (completion_tokens - 1) / decode_seconds : 0.0;
  }
  // Tokens per target step: 1 + accepted drafts per step (1 for plain decoding); 0 without steps.
  double tokens_per_step() const {
    return decode_steps > 0 ? 1.0 + static_cast<double>(accepted_draft_tokens) / decode_steps : 0.0;
  }
};

// The engine's prefix cache after a generation (/metrics): counters since the start, what it holds now.
struct PrefixCacheInfo {
  int64_t lookups = 0;
  int64_t hits = 0;       // lookups that resumed from a cached prefix
  int64_t evictions = 0;  // blocks and snapshots dropped for room
  int64_t demotions = 0;  // blocks and snapshots moved from device to host memory for room
  int64_t device_bytes = 0;
  int64_t host_bytes = 0;
  int64_t device_budget = 0;
  int64_t host_budget = 0;
  int64_t blocks = 0;
  int64_t snapshots = 0;
};

struct GenerationResult {
  FinishReason reason = FinishReason::kStop;
  GenerationStats stats;
  std::optional<PrefixCacheInfo> prefix_cache;  // set by engines with a prefix cache
  std::string error;                            // kError only: what went wrong, for the log and the client
  // Set by the scheduler, not the engine: the request's stop string that ended the generation, if one did
  // (Anthropic's API reports it).
  std::optional<std::string> stop_string;
};

class GenerationSink {
 public:
  virtual ~GenerationSink() = default;
  // Returns false when the request wants no more output (client gone, stop string matched, shutdown).
  virtual bool on_output(GenerationOutput output) = 0;
  // True once the request was cancelled; cheap enough to poll between prefill chunks and decode steps.
  virtual bool cancelled() const = 0;
};

struct EngineInfo {
  std::string model_id;      // served model name (the --model-alias or the model directory's name)
  int32_t context_size = 0;  // tokens, prompt + completion
  int32_t vocab_size = 0;    // logit_bias ids must be below it
  int32_t mtp_draft = 0;     // MTP draft length k, 0 = off
  std::string backend;       // "cpu", "cuda", "fake"
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual EngineInfo info() const = 0;
  // Called only from the engine thread, one request at a time.
  virtual GenerationResult generate(const GenerationRequest& request, GenerationSink& sink) = 0;
};

}  // namespace pd::server
