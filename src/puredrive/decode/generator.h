// Generator: the decode loop of one sequence (docs/DESIGN.md §2): prefill, then plain one-row steps or MTP
// cycles (draft k tokens, verify k+1 rows in one target step, accept, roll back), until a stop condition.
//
// Exactness (docs/DESIGN.md §4, docs/spec/speculative.md): plain decoding and MTP cycles share everything but
// the number of rows per target step. The prompt's last token is not prefilled: like every later token it is
// the first row of a step, so the first generated token comes out of a step too (and can be drafted). Every
// emitted token comes from the backend's sample op (DeviceSampler) over rows that are bitwise the rows a
// one-row step would give; the op computes process_logits() with the rule's draw_token() (plain) or
// Verifier::accept() (cycle) on the device, and only the tokens come back, so:
//   - greedy (kGreedy) and seeded (kSeeded) outputs are identical with MTP on and off, for any drafter;
//   - token-wise / block outputs are distributed exactly as plain sampling (chi-square tests).
//
// One cycle, x_n the newest committed token at position n (docs/spec/speculative.md §1):
//   draft d_1..d_k (Drafter) -> forward([x_n, d_1..d_k], positions n..n+k) -> sample op: p_0..p_k with the
//   penalties of each row's history, accept a, y -> emit d_1..d_a, y -> state.rewind(n + a + 1) (GDN
//   snapshot of row a, KV beyond it dead) -> the drafter observes rows n..n+a (tokens d_1..d_a, y; the
//   verify hidden states).
// The steps and cycles run through CycleRunner (cycle_runner.h): each is one recorded backend step (a CUDA
// graph) with one host synchronisation, the drafts never leave the device, and the rollback and observation
// are queued at the head of the next step.
//
// When generate() returns, the state holds the prompt and every emitted token but the last, exactly as plain
// decoding leaves it (rejected rows rewound, also when a stop cut a cycle short).
//
// Stop conditions, checked after every emitted token in order: a stop token id (emitted and counted, kStop),
// max_tokens (kLength), a full context: prompt + generated == context size (kContextFull). Stop strings
// live on the text side (text_stream.h). A sink that returns false, or request.cancelled(), ends with
// kCancelled.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "puredrive/decode/accept_stats.h"
#include "puredrive/decode/acceptance.h"
#include "puredrive/decode/drafter.h"
#include "puredrive/decode/sampler.h"
#include "puredrive/decode/sampling_params.h"
#include "puredrive/model/model.h"
#include "puredrive/model/prefix_cache.h"
#include "puredrive/util/finish_reason.h"

namespace pd {

struct GeneratorOptions {
  int ctx_size = 4096;            // KV capacity: prompt + generated tokens
  DType kv_dtype = DType::kBF16;  // kBF16 or kF32
  int max_draft = 4;              // the largest k a request may ask for (k + 1 GDN snapshots are kept)
  bool mtp = true;                // attach an MtpDrafter when the model has an MTP head
};

struct DecodeRequest {
  std::vector<int32_t> prompt;  // >= 1 token, fewer than the context size
  SamplingParams sampling;      // validated by generate()
  int max_tokens = 16;
  std::vector<int32_t> stop_token_ids;  // EOS ids (model_defaults.h)
  int num_draft = 0;                    // k: 0 = plain decoding, 1..max_draft = MTP cycles
  // With num_draft > 0: each step drafts 0..num_draft tokens, as the request's own acceptance and step
  // times say pays best (draft_policy.h); the emitted tokens are the same either way.
  bool adaptive_draft = false;
  // The acceptance rule; default choose_accept_rule(sampling, block_verification). kGreedy needs
  // temperature 0, kSeeded a seed.
  std::optional<AcceptRule> rule;
  bool block_verification = true;
  std::optional<float> draft_temperature;  // the draft distributions' temperature (draft side only)
  uint64_t rng_seed = 0;                   // kTokenwise / kBlock streams (sampling.seed when set)
  // -1: none. 0..20: per emitted token the log-probability under log_softmax of the raw logits row, plus
  // this many most likely alternatives (the server's convention, engine_port.h).
  int top_logprobs = -1;
  bool keep_last_logits = false;  // DecodeResult::last_logits
  // Synchronise the device after every target step and every draft, so that the draft / target / sample
  // times of DecodeResult are separate (otherwise the device's work lands where the host waits for it, in
  // the sample time). Costs two more host waits per cycle.
  bool timing = false;
  // Wait for the device at the end of the prefill, which otherwise returns with its work still queued: the
  // first decode step's wait would absorb that work, and DecodeResult would time it as decode. With this,
  // prefill_seconds holds the prefill's device time and decode_seconds none of it (bench --model). One more
  // host wait per request.
  bool wait_for_prefill = false;
  std::optional<Verifier> verifier;  // overrides the rule's verifier (testonly faulty rules)
  Drafter* drafter = nullptr;        // overrides the generator's drafter for this request (tests, check)
  std::function<bool()> cancelled;   // polled between prefill chunks and steps
  bool prefix_cache = true;          // use the generator's prefix cache, when it has one
};

// What one step emitted (1 token for a plain step, a + 1 for a cycle, fewer when a stop cut it).
struct DecodeChunk {
  std::span<const int32_t> tokens;
  std::span<const TokenLogprobs> logprobs;  // one per token when requested
};
// Returns false to stop (kCancelled).
using ChunkSink = std::function<bool(const DecodeChunk& chunk)>;

struct DecodeResult {
  std::vector<int32_t> tokens;  // every emitted token, a final stop token included
  FinishReason reason = FinishReason::kLength;
  AcceptStats accept;               // cycles only; draft_seconds / verify_seconds filled in
  std::vector<int> cycle_accepted;  // a of every cycle, in order
  std::vector<float> last_logits;   // [V] raw logits the last token was drawn from (keep_last_logits)
  int64_t steps = 0;                // target steps after prefill (plain steps + verify passes)
  int64_t plain_steps = 0;
  double prefill_seconds = 0;  // the prompt's first L-1 tokens, MTP rows included (see wait_for_prefill)
  double decode_seconds = 0;   // everything after the prefill
  double target_seconds = 0;   // target steps (plain and verify)
  double sample_seconds = 0;   // the sample op: processing, draws and acceptance, and its download
  int cached_tokens = 0;       // prompt tokens restored from the prefix cache instead of prefilled

  // "... tokens/cycle 2.31, accepted 71.2% (per position 88.0% 69.1%), ... decode 1.2 s (draft 12%,
  // verify 60%, plain steps 20%, sample 5%)"; with DecodeRequest::timing the shares are separate.
  std::string summary() const;
};

class Generator {
 public:
  static Expected<std::unique_ptr<Generator>> create(Model& model, const GeneratorOptions& options);

  // Replaces the drafter (tests: scripted drafters); nullptr leaves plain decoding only. Requests then bypass
  // the prefix cache, whose blocks carry the MTP head's rows.
  void set_drafter(std::unique_ptr<Drafter> drafter) {
    drafter_ = std::move(drafter);
    mtp_drafter_ = false;
  }
  bool has_drafter() const { return drafter_ != nullptr; }

  // Attaches a prefix cache with these budgets (options.mtp is set when the generator drafts with the MTP
  // head). A request then resumes from the longest cached prefix of its prompt and stores the blocks it
  // prefills, with snapshots at every prefill chunk's end, at the block where the prompt left the cached
  // chain and at the prompt's last block boundary; prefill chunks split at those points. Needs prefill chunks
  // (the model's max rows) that are a multiple of kPrefixBlock. Outputs are bitwise those without the cache
  // (docs/DESIGN.md §4.8). Requests with their own drafter bypass it.
  Status enable_prefix_cache(PrefixCacheOptions options);
  PrefixCache* prefix_cache() const { return prefix_cache_.get(); }

  // Runs one request from an empty sequence. Bad requests (ids out of range, invalid sampling, k too large,
  // a rule that does not fit the sampling) are kInvalidArgument; model errors are passed on.
  Expected<DecodeResult> generate(const DecodeRequest& request, const ChunkSink& sink = {});

  Model& model() const { return model_; }
  const GeneratorOptions& options() const { return options_; }
  const SequenceState& state() const { return state_; }
  int vocab_size() const { return model_.config().vocab_size; }

 private:
  Generator(Model& model, const GeneratorOptions& options, SequenceState state)
      : model_(model), options_(options), state_(std::move(state)) {}
  class Run;

  Model& model_;
  GeneratorOptions options_;
  SequenceState state_;
  std::unique_ptr<Drafter> drafter_;
  bool mtp_drafter_ = false;  // drafter_ is the MTP head's
  std::unique_ptr<DeviceSampler> sampler_;
  std::unique_ptr<PrefixCache> prefix_cache_;
};

}  // namespace pd
