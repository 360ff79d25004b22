#include "cli/generator_engine.h"

#include <algorithm>

#include "puredrive/tokenizer/detokenizer.h"

namespace pd::cli {
namespace {

using server::GenerationOutput;
using server::GenerationRequest;
using server::GenerationResult;
using server::GenerationSink;
using server::GenerationStats;
using server::SamplingOptions;
using server::TokenLogprob;

SamplingParams to_params(const SamplingOptions& s) {
  SamplingParams p;
  p.temperature = s.temperature;
  p.top_p = s.top_p;
  p.top_k = s.top_k;
  p.min_p = s.min_p;
  p.presence_penalty = s.presence_penalty;
  p.frequency_penalty = s.frequency_penalty;
  p.seed = s.seed;
  for (const auto& [token, bias] : s.logit_bias) p.logit_bias[token] += bias;
  return p;
}

}  // namespace

GeneratorEngine::GeneratorEngine(std::unique_ptr<Generator> generator, Tokenizer tokenizer,
                                 server::EngineInfo info, int mtp_draft, GeneratorEngineOptions options)
    : generator_(std::move(generator)),
      tokenizer_(std::move(tokenizer)),
      info_(std::move(info)),
      mtp_draft_(generator_->has_drafter() ? std::clamp(mtp_draft, 0, generator_->options().max_draft) : 0),
      options_(std::move(options)),
      seeds_(std::random_device{}()) {}

GenerationResult GeneratorEngine::generate(const GenerationRequest& request, GenerationSink& sink) {
  GenerationResult result;
  result.stats.prompt_tokens = static_cast<int32_t>(request.prompt_ids.size());
  const Tokenizer& tok = tokenizer_;

  DecodeRequest req;
  req.prompt = request.prompt_ids;
  req.sampling = to_params(request.sampling);
  req.max_tokens = request.max_tokens;
  req.stop_token_ids = request.stop_token_ids;
  req.num_draft = request.mtp ? mtp_draft_ : 0;
  req.adaptive_draft = options_.adaptive_draft;
  req.block_verification = options_.block_verification;
  req.draft_temperature = options_.draft_temperature;
  req.rng_seed = seeds_();
  req.top_logprobs = request.logprobs;
  req.cancelled = [&sink] { return sink.cancelled(); };

  StreamingDetokenizer detok(tok);
  const ChunkSink on_chunk = [&](const DecodeChunk& c) {
    GenerationOutput out;
    out.token_ids.assign(c.tokens.begin(), c.tokens.end());
    for (size_t i = 0; i < c.tokens.size(); ++i) {
      const int32_t id = c.tokens[i];
      const bool stop =
          i + 1 == c.tokens.size() &&
          std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(), id) != req.stop_token_ids.end();
      if (!stop) detok.push(id, out.text);  // a stop token is counted but has no text
    }
    for (const TokenLogprobs& lp : c.logprobs) {
      TokenLogprob t{.token_id = lp.token,
                     .token = std::string(tok.token_bytes(lp.token)),
                     .logprob = lp.logprob,
                     .top = {}};
      for (const auto& [id, logprob] : lp.top) {
        t.top.push_back({.token_id = id, .token = std::string(tok.token_bytes(id)), .logprob = logprob});
      }
      out.logprobs.push_back(std::move(t));
    }
    return sink.on_output(std::move(out));
  };

  Expected<DecodeResult> r = generator_->generate(req, on_chunk);
  if (const PrefixCache* cache = generator_->prefix_cache()) {
    const PrefixCacheStats& c = cache->stats();
    result.prefix_cache = server::PrefixCacheInfo{.lookups = c.lookups,
                                                  .hits = c.hits,
                                                  .evictions = c.evictions,
                                                  .demotions = c.demotions,
                                                  .device_bytes = c.device_bytes,
                                                  .host_bytes = c.host_bytes,
                                                  .device_budget = c.device_budget,
                                                  .host_budget = c.host_budget,
                                                  .blocks = c.blocks,
                                                  .snapshots = c.snapshots};
  }
  if (!r) {
    result.reason = FinishReason::kError;
    result.error = r.status().message();
    return result;
  }
  result.reason = r->reason;
  if (result.reason != FinishReason::kCancelled) {
    // A character left unfinished at the end becomes U+FFFD, as the tokenizer's decode() does.
    std::string tail = detok.finish();
    if (!tail.empty())
      sink.on_output(GenerationOutput{.token_ids = {}, .text = std::move(tail), .logprobs = {}});
  }
  GenerationStats& st = result.stats;
  st.completion_tokens = static_cast<int32_t>(r->tokens.size());
  st.cached_prompt_tokens = r->cached_tokens;
  st.prefill_seconds = r->prefill_seconds;
  st.decode_seconds = r->decode_seconds;
  st.decode_steps = r->steps;
  st.draft_tokens = r->accept.drafted;
  st.accepted_draft_tokens = r->accept.accepted;
  st.proposed_at = r->accept.proposed_at;
  st.accepted_at = r->accept.accepted_at;
  return result;
}

}  // namespace pd::cli
