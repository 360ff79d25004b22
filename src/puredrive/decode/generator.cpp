#include "puredrive/decode/generator.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>

#include "puredrive/decode/cycle_runner.h"
#include "puredrive/decode/draft_policy.h"
#include "puredrive/decode/mtp_drafter.h"
#include "puredrive/util/clock.h"

namespace pd {
namespace {

using Clock = std::chrono::steady_clock;

Status check_request(const DecodeRequest& r, int vocab, int ctx_size, int max_draft, bool has_drafter) {
  if (r.prompt.empty()) return make_error(ErrorCode::kInvalidArgument, "the prompt is empty");
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    if (r.prompt[i] < 0 || r.prompt[i] >= vocab) {
      return make_error(ErrorCode::kInvalidArgument, "prompt token {} is {}, outside the vocabulary [0, {})",
                        i, r.prompt[i], vocab);
    }
  }
  if (static_cast<int64_t>(r.prompt.size()) >= ctx_size) {
    return make_error(ErrorCode::kInvalidArgument,
                      "the prompt has {} tokens; the context holds {}, which leaves no room to generate",
                      r.prompt.size(), ctx_size);
  }
  if (r.max_tokens < 0) return make_error(ErrorCode::kInvalidArgument, "max_tokens is {}", r.max_tokens);
  PD_TRY(r.sampling.validate(vocab));
  if (r.num_draft < 0 || r.num_draft > max_draft) {
    return make_error(ErrorCode::kInvalidArgument, "MTP draft length {} must be in 0..{}", r.num_draft,
                      max_draft);
  }
  if (r.num_draft > 0 && !has_drafter) {
    return make_error(ErrorCode::kUnsupported,
                      "MTP draft length {} asked, but this model has no MTP head (use plain decoding)",
                      r.num_draft);
  }
  const AcceptRule rule =
      r.verifier ? r.verifier->rule() : r.rule.value_or(choose_accept_rule(r.sampling, r.block_verification));
  if (rule == AcceptRule::kGreedy && !r.sampling.is_greedy()) {
    return make_error(ErrorCode::kInvalidArgument, "greedy acceptance needs temperature 0, got {}",
                      r.sampling.temperature);
  }
  if (rule == AcceptRule::kSeeded && !r.sampling.seed) {
    return make_error(ErrorCode::kInvalidArgument, "seeded acceptance needs a seed");
  }
  if (r.draft_temperature && !(*r.draft_temperature >= 0.0f && std::isfinite(*r.draft_temperature))) {
    return make_error(ErrorCode::kInvalidArgument, "draft temperature must be >= 0, got {}",
                      *r.draft_temperature);
  }
  if (r.top_logprobs > SamplingParams::kMaxTopLogprobs) {
    return make_error(ErrorCode::kInvalidArgument, "top_logprobs must be in -1..{}, got {}",
                      SamplingParams::kMaxTopLogprobs, r.top_logprobs);
  }
  for (int32_t t : r.stop_token_ids) {
    if (t < 0 || t >= vocab) {
      return make_error(ErrorCode::kInvalidArgument, "stop token id {} is outside the vocabulary [0, {})", t,
                        vocab);
    }
  }
  return Status::ok();
}

}  // namespace

std::string DecodeResult::summary() const {
  std::string s = fmt::format("{} tokens, {} steps ({} plain)", tokens.size(), steps, plain_steps);
  if (accept.cycles > 0) {
    s += fmt::format(", tokens/cycle {:.2f}, accepted {:.1f}% (per position", accept.tokens_per_cycle(),
                     100.0 * accept.acceptance_rate());
    for (size_t j = 0; j < accept.proposed_at.size(); ++j) {
      s += fmt::format(" {:.1f}%", 100.0 * accept.acceptance_rate_at(j));
    }
    s += ")";
  }
  const double d = decode_seconds > 0 ? decode_seconds : 1.0;
  s += fmt::format(
      ", prefill {:.3f} s, decode {:.3f} s (draft {:.0f}%, verify {:.0f}%, plain steps {:.0f}%, sample "
      "{:.0f}%)",
      prefill_seconds, decode_seconds, 100.0 * accept.draft_seconds / d, 100.0 * accept.verify_seconds / d,
      100.0 * (target_seconds - accept.verify_seconds) / d, 100.0 * sample_seconds / d);
  return s;
}

// ------------------------------------------------------------------------------------------------------------

// The state of one request.
class Generator::Run {
 public:
  Run(Generator& g, const DecodeRequest& r, const ChunkSink& sink)
      : g_(g),
        r_(r),
        sink_(sink),
        vocab_(g.vocab_size()),
        sampler_(*g.sampler_),
        draft_rng_(splitmix64_mix((r.sampling.seed ? *r.sampling.seed : r.rng_seed) ^ 0x6472616674ULL)),
        accept_rng_(splitmix64_mix((r.sampling.seed ? *r.sampling.seed : r.rng_seed) ^ 0x746172676574ULL)),
        verifier_(r.verifier
                      ? *r.verifier
                      : Verifier(r.rule.value_or(choose_accept_rule(r.sampling, r.block_verification)))),
        // Plain decoding leaves the drafter alone: no MTP work at all.
        drafter_(r.num_draft == 0       ? nullptr
                 : r.drafter != nullptr ? r.drafter
                                        : g.drafter_.get()),
        cache_(g.prefix_cache_ && r.prefix_cache && r.drafter == nullptr &&
                       g.prefix_cache_->mtp() == g.mtp_drafter_
                   ? g.prefix_cache_.get()
                   : nullptr),
        // With a cache, plain requests run the MTP head over the prompt too, so that its blocks are whole.
        observer_(drafter_ != nullptr || cache_ == nullptr ? drafter_ : g.drafter_.get()),
        runner_(g.model_, g.state_, *g.sampler_, drafter_, draft_rng_, accept_rng_,
                {.verifier = verifier_,
                 .seed = r.sampling.seed.value_or(0),
                 .top_logprobs = r.top_logprobs,
                 .timing = r.timing}) {
    draft_params_ = r.sampling;
    if (r.draft_temperature && !r.sampling.is_greedy()) draft_params_.temperature = *r.draft_temperature;
    if (r.adaptive_draft && drafter_ != nullptr) policy_.emplace(r.num_draft);
  }

  Expected<DecodeResult> run() {
    SequenceState& st = g_.state_;
    PD_TRY(st.reset());
    if (observer_) observer_->reset();
    PD_TRY(sampler_.begin(r_.sampling, draft_params_, r_.prompt));
    seq_ = r_.prompt;
    const auto t0 = Clock::now();
    if (r_.max_tokens == 0) {
      result_.reason = FinishReason::kLength;
      return std::move(result_);
    }
    PD_TRY(prefill());
    if (r_.wait_for_prefill) PD_TRY(g_.model_.backend().synchronize());
    result_.prefill_seconds = seconds_since(t0);
    const auto t1 = Clock::now();
    while (!done_) {
      if (r_.cancelled && r_.cancelled()) {
        finish(FinishReason::kCancelled);
        break;
      }
      const int total = static_cast<int>(seq_.size());
      // No drafts that could not be emitted: a cycle emits at most k + 1 tokens, within max_tokens and the
      // context.
      const int k = std::min({policy_ ? policy_->next() : r_.num_draft, r_.max_tokens - generated() - 1,
                              st.capacity() - total - 1, g_.model_.max_rows() - 1, st.max_rows() - 1});
      const int64_t n = total - 1;
      const auto s0 = Clock::now();
      if (k >= 1 && drafter_ && drafter_->can_draft(n)) {
        PD_TRY(cycle(k));
        if (policy_) policy_->record_cycle(k, result_.cycle_accepted.back(), seconds_since(s0));
      } else {
        PD_TRY(plain_step());
        if (policy_) policy_->record_plain(seconds_since(s0));
      }
    }
    PD_TRY(runner_.finish());
    result_.decode_seconds = seconds_since(t1);
    const CycleTimes& t = runner_.times();
    result_.steps = t.steps;
    result_.plain_steps = t.plain_steps;
    result_.target_seconds = t.target_seconds;
    result_.sample_seconds = t.sample_seconds;
    result_.accept.draft_seconds = t.draft_seconds;
    result_.accept.verify_seconds = t.verify_seconds;
    result_.tokens.assign(seq_.begin() + static_cast<std::ptrdiff_t>(r_.prompt.size()), seq_.end());
    return std::move(result_);
  }

 private:
  int generated() const { return static_cast<int>(seq_.size() - r_.prompt.size()); }

  // All prompt tokens but the last, in chunks of the model's max rows on the backend's prefill kernels
  // (ForwardOptions::prefill); the drafter observes every row (its next token is known). Cancellation is
  // checked between chunks. With a prefix cache the prefill starts where the cached prefix ends, and chunks
  // also end where the prompt leaves the cached chain and at its last block boundary, where the cache takes
  // snapshots: every chunk still starts on a multiple of 64 positions (chunking invariance, docs/DESIGN.md
  // §4.6).
  Status prefill() {
    SequenceState& st = g_.state_;
    const std::span<const int32_t> prompt(r_.prompt);
    const int count = static_cast<int>(prompt.size()) - 1;
    const int chunk = g_.model_.max_rows();
    int begin = 0;
    int stops[2] = {0, 0};
    if (cache_ && count >= kPrefixBlock) {
      const PrefixMatch m = cache_->lookup(prompt.first(static_cast<size_t>(count)));
      if (m.resume > 0) PD_TRY(resume(m.resume));
      begin = m.resume;
      stops[0] = m.matched;
      stops[1] = count / kPrefixBlock * kPrefixBlock;
    }
    std::vector<int32_t> positions;
    while (begin < count) {
      if (r_.cancelled && r_.cancelled()) return Status::ok();  // run() sees it next
      int end = std::min(begin + chunk, count);
      for (const int s : stops) {
        if (s > begin && s < end) end = s;
      }
      const int rows = end - begin;
      positions.resize(static_cast<size_t>(rows));
      std::iota(positions.begin(), positions.end(), begin);
      const std::span<const int32_t> tokens = prompt.subspan(static_cast<size_t>(begin), rows);
      PD_ASSIGN_OR_RETURN(
          StepOutput out,
          g_.model_.forward(st, tokens, positions, {.logits = LogitRows::kNone, .tap = {}, .prefill = true}));
      if (observer_) {
        PD_TRY(
            observer_->observe(st, begin, prompt.subspan(static_cast<size_t>(begin) + 1, rows), out.hidden));
      }
      if (cache_ && end % kPrefixBlock == 0) {
        if (observer_) PD_TRY(observer_->commit(st));
        PD_TRY(cache_->store(st, prompt, end, out.hidden.row_slice(rows - 1, 1)));
      }
      begin = end;
    }
    return Status::ok();
  }

  // Starts from the cached state after the prompt's first `length` tokens; the MTP head's row length - 1
  // (the cached hidden state and the token at `length`) waits for the next flush, as in a cold prefill.
  Status resume(int length) {
    SequenceState& st = g_.state_;
    const std::span<const int32_t> prompt(r_.prompt);
    PD_ASSIGN_OR_RETURN(const Tensor hidden, cache_->restore(st, prompt, length));
    result_.cached_tokens = length;
    if (observer_ == nullptr) return Status::ok();
    PD_TRY(observer_->resume(length - 1));
    if (hidden.empty()) return Status::ok();
    return observer_->observe(st, length - 1, prompt.subspan(static_cast<size_t>(length), 1), hidden);
  }

  // One step or cycle through the runner, then the emitted tokens (a stop may cut them short) and what
  // stays of the step.
  Status plain_step() {
    PD_ASSIGN_OR_RETURN(const Verdict* v, runner_.plain_step(seq_));
    return commit(*v);
  }

  Status cycle(int k) {
    PD_ASSIGN_OR_RETURN(const Verdict* v, runner_.cycle(seq_, static_cast<int>(r_.prompt.size()), k));
    result_.accept.record(k, v->accepted);
    result_.cycle_accepted.push_back(v->accepted);
    return commit(*v);
  }

  Status commit(const Verdict& v) {
    verdict_ = &v;
    emitted_ = v.tokens;
    PD_TRY(emit(runner_.logits()));
    return runner_.commit(static_cast<int>(emitted_.size()), !done_);
  }

  // Appends emitted_ (token i came from logits row i) and applies the stop conditions, cutting the chunk
  // after the token that stops.
  Status emit(const Tensor& logits) {
    size_t count = 0;
    logprobs_.clear();
    for (int32_t t : emitted_) {
      if (r_.top_logprobs >= 0) logprobs_.push_back(verdict_->logprobs[count]);
      seq_.push_back(t);
      ++count;
      if (std::find(r_.stop_token_ids.begin(), r_.stop_token_ids.end(), t) != r_.stop_token_ids.end()) {
        finish(FinishReason::kStop);
      } else if (generated() >= r_.max_tokens) {
        finish(FinishReason::kLength);
      } else if (static_cast<int>(seq_.size()) >= g_.state_.capacity()) {
        finish(FinishReason::kContextFull);
      }
      if (done_) break;
    }
    emitted_.resize(count);
    if (r_.keep_last_logits && count > 0) {
      result_.last_logits.resize(static_cast<size_t>(vocab_));
      PD_TRY(g_.model_.backend().download(result_.last_logits.data(),
                                          logits.row_slice(static_cast<int64_t>(count) - 1, 1)));
    }
    if (sink_ && !sink_(DecodeChunk{.tokens = emitted_, .logprobs = logprobs_}) && !done_) {
      finish(FinishReason::kCancelled);
    }
    return Status::ok();
  }

  void finish(FinishReason reason) {
    done_ = true;
    result_.reason = reason;
  }

  Generator& g_;
  const DecodeRequest& r_;
  const ChunkSink& sink_;
  const int vocab_;
  DeviceSampler& sampler_;
  Rng draft_rng_;
  Rng accept_rng_;
  Verifier verifier_;
  Drafter* drafter_;    // may be null: plain decoding only
  PrefixCache* cache_;  // may be null: no prefix cache for this request
  Drafter* observer_;   // observes the prompt: drafter_, or the MTP drafter for the cache's blocks
  CycleRunner runner_;
  SamplingParams draft_params_;
  std::optional<DraftPolicy> policy_;  // adaptive_draft with a drafter

  std::vector<int32_t> seq_;  // prompt + generated
  bool done_ = false;
  DecodeResult result_;
  // Reused per step.
  const Verdict* verdict_ = nullptr;
  std::vector<int32_t> emitted_;
  std::vector<TokenLogprobs> logprobs_;
};

Expected<std::unique_ptr<Generator>> Generator::create(Model& model, const GeneratorOptions& options) {
  if (options.max_draft >= kSampleMaxRows) {
    return make_error(ErrorCode::kInvalidArgument,
                      "MTP draft length up to {} asked; the sampler verifies at most {}", options.max_draft,
                      kSampleMaxRows - 1);
  }
  if (options.max_draft < 0 || options.max_draft + 1 > model.max_rows()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "MTP draft length up to {} needs {} rows per step; the model takes {}",
                      options.max_draft, options.max_draft + 1, model.max_rows());
  }
  if (options.ctx_size < 2) {
    return make_error(ErrorCode::kInvalidArgument, "context size must be at least 2, got {}",
                      options.ctx_size);
  }
  PD_ASSIGN_OR_RETURN(SequenceState state, model.new_state({.ctx_size = options.ctx_size,
                                                            .kv_dtype = options.kv_dtype,
                                                            .max_rows = std::max(2, options.max_draft + 1)}));
  auto g = std::unique_ptr<Generator>(new Generator(model, options, std::move(state)));
  PD_ASSIGN_OR_RETURN(g->sampler_, DeviceSampler::create(model.backend(), model.config().vocab_size));
  if (options.mtp && model.has_mtp() && options.max_draft > 0) {
    PD_ASSIGN_OR_RETURN(std::unique_ptr<MtpDrafter> d, MtpDrafter::create(model));
    g->drafter_ = std::move(d);
    g->mtp_drafter_ = true;
  }
  return g;
}

Status Generator::enable_prefix_cache(PrefixCacheOptions options) {
  if (model_.max_rows() % kPrefixBlock != 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "the prefix cache needs prefill chunks of a multiple of {} rows (the blocks it resumes "
                      "at); the model takes {}",
                      kPrefixBlock, model_.max_rows());
  }
  options.mtp = mtp_drafter_;
  PD_ASSIGN_OR_RETURN(prefix_cache_,
                      PrefixCache::create(model_.backend(), model_.cache_spec(), options_.kv_dtype,
                                          model_.config().hidden_size, options));
  return Status::ok();
}

Expected<DecodeResult> Generator::generate(const DecodeRequest& request, const ChunkSink& sink) {
  PD_TRY(check_request(request, vocab_size(), options_.ctx_size, options_.max_draft,
                       drafter_ != nullptr || request.drafter != nullptr));
  Run run(*this, request, sink);
  return run.run();
}

}  // namespace pd
