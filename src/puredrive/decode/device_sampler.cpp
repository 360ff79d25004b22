#include "puredrive/decode/device_sampler.h"

#include "puredrive/backend/sampling_math.h"
#include "puredrive/decode/sampler.h"

namespace pd {

namespace {

// Output words: one slot per draft draw (prior 0 .. kSampleMaxRows - 2), then the verification's.
constexpr int64_t kDrawWords = sample_out_words(1, -1);
constexpr int64_t kVerifyOffset = (kSampleMaxRows - 1) * kDrawWords;

}  // namespace

Expected<std::unique_ptr<DeviceSampler>> DeviceSampler::create(Backend& backend, int32_t vocab) {
  if (vocab < 1 || vocab > kSampleMaxVocab) {
    return make_error(ErrorCode::kUnsupported,
                      "the sampler takes vocabularies of 1..{} tokens, this one has {}", kSampleMaxVocab,
                      vocab);
  }
  auto s = std::unique_ptr<DeviceSampler>(new DeviceSampler(backend, vocab));
  PD_ASSIGN_OR_RETURN(s->control_, backend.alloc(DType::kI64, 1, kSampleControlWords));
  PD_ASSIGN_OR_RETURN(s->drafts_, backend.alloc(DType::kI32, 1, kSampleMaxRows));
  PD_ASSIGN_OR_RETURN(
      s->out_,
      backend.alloc(DType::kI32, 1, kVerifyOffset + sample_out_words(kSampleMaxRows, kSampleMaxLogprobs)));
  s->control_host_.assign(kSampleControlWords, 0);
  return s;
}

Status DeviceSampler::begin(const SamplingParams& target, const SamplingParams& draft,
                            std::span<const int32_t> prompt) {
  queued_draws_.clear();
  queued_rows_ = 0;
  target_ = sample_params(target);
  draft_ = sample_params(draft);
  penalised_ = target.has_penalties() || draft.has_penalties();
  has_bias_ = !target.logit_bias.empty();
  if (has_bias_) {
    if (bias_.empty()) {
      PD_ASSIGN_OR_RETURN(bias_, backend_.alloc(DType::kF32, 1, vocab_));
    }
    std::vector<float> row(static_cast<size_t>(vocab_), 0.0f);
    for (const auto& [token, b] : target.logit_bias) {
      if (token >= 0 && token < vocab_) row[static_cast<size_t>(token)] = b;
    }
    PD_TRY(backend_.upload(bias_.tensor(), row.data()));
  }
  if (penalised_) {
    if (history_.empty()) {
      PD_ASSIGN_OR_RETURN(history_, backend_.alloc(DType::kI32, 1, vocab_));
    }
    std::vector<int32_t> row(static_cast<size_t>(vocab_), 0);
    for (int32_t t : prompt) {
      if (t >= 0 && t < vocab_) row[static_cast<size_t>(t)] = kHistoryPromptBit;
    }
    PD_TRY(backend_.upload(history_.tensor(), row.data()));
  }
  return Status::ok();
}

Status DeviceSampler::upload_drafts(std::span<const int32_t> tokens) {
  if (tokens.size() >= static_cast<size_t>(kSampleMaxRows)) {
    return make_error(ErrorCode::kInvalidArgument, "{} drafts; the sampler takes at most {}", tokens.size(),
                      kSampleMaxRows - 1);
  }
  if (tokens.empty()) return Status::ok();
  return backend_.upload(drafts_.tensor().col_slice(0, static_cast<int64_t>(tokens.size())), tokens.data());
}

Expected<std::vector<int32_t>> DeviceSampler::download_drafts(int k) {
  if (k < 0 || k >= kSampleMaxRows) {
    return make_error(ErrorCode::kInvalidArgument, "{} drafts; the sampler holds at most {}", k,
                      kSampleMaxRows - 1);
  }
  std::vector<int32_t> out(static_cast<size_t>(k));
  if (k > 0) PD_TRY(backend_.download(out.data(), drafts_.tensor().col_slice(0, k)));
  return out;
}

Expected<Tensor> DeviceSampler::draft_rows(int k) {
  if (k < 1 || k >= kSampleMaxRows) {
    return make_error(ErrorCode::kInvalidArgument, "{} draft rows; the sampler takes 1..{}", k,
                      kSampleMaxRows - 1);
  }
  if (draft_rows_.empty()) {
    PD_ASSIGN_OR_RETURN(draft_rows_, backend_.alloc(DType::kF32, kSampleMaxRows - 1, vocab_));
  }
  return draft_rows_.row_slice(0, k);
}

Status DeviceSampler::stage(std::span<const double> uniforms, uint64_t seed, int64_t position) {
  if (uniforms.size() > static_cast<size_t>(kSampleMaxRows)) {
    return make_error(ErrorCode::kInvalidArgument, "{} uniforms; the sampler takes at most {}",
                      uniforms.size(), kSampleMaxRows);
  }
  control_host_.assign(kSampleControlWords, 0);
  control_host_[kControlSeed] = static_cast<int64_t>(seed);
  control_host_[kControlPosition] = position;
  for (size_t i = 0; i < uniforms.size(); ++i) {
    control_host_[kControlUniforms + i] = static_cast<int64_t>(double_bits(uniforms[i]));
  }
  return backend_.upload(control_.tensor(), control_host_.data());
}

Status DeviceSampler::launch(SampleArgs& a, int rows, int64_t offset) {
  a.control = control_.tensor();
  a.out = out_.tensor().col_slice(offset, sample_out_words(rows, a.logprobs));
  if (has_bias_) a.bias = bias_.tensor();
  if (penalised_) a.history = history_.tensor();
  return backend_.sample(a);
}

Status DeviceSampler::check(const int32_t* words) const {
  const auto status = static_cast<SampleStatus>(words[kSampleOutStatus]);
  const int32_t d1 = words[1], d2 = words[2];
  switch (status) {
    case SampleStatus::kOk:
      return Status::ok();
    case SampleStatus::kNonFinite:
      return make_error(ErrorCode::kInternal,
                        "sampler: logits row {} has a NaN or +inf logit at token {} (vocab {})", d1, d2,
                        vocab_);
    case SampleStatus::kAllMasked:
      return make_error(ErrorCode::kInternal, "sampler: every logit of row {} is -inf (vocab {})", d1,
                        vocab_);
    case SampleStatus::kDraftNotInDraft:
      return make_error(
          ErrorCode::kInternal,
          "sampler: draft {} has draft probability 0: it was not drawn from its draft distribution", d1 + 1);
    case SampleStatus::kBadToken:
      return make_error(ErrorCode::kInternal, "sampler: draft {} is token {}, outside the vocabulary [0, {})",
                        d1 + 1, d2, vocab_);
  }
  return make_error(ErrorCode::kInternal, "sampler: unknown status {}", words[kSampleOutStatus]);
}

Status DeviceSampler::queue_draft(const Tensor& row, AcceptRule rule, int prior) {
  if (prior < 0 || prior >= kSampleMaxRows - 1) {
    return make_error(ErrorCode::kInvalidArgument, "draft draw after {} drafts; the sampler holds {}", prior,
                      kSampleMaxRows - 1);
  }
  SampleArgs a;
  a.rule = sample_rule(rule);
  a.target = draft_;
  a.logits = row;
  a.drafts = drafts_.tensor();
  a.prior = prior;
  a.write_draft = true;
  PD_TRY(launch(a, 1, prior * kDrawWords));
  queued_draws_.push_back(prior);
  return Status::ok();
}

Expected<int32_t> DeviceSampler::draw_draft(const Tensor& row, AcceptRule rule, int prior) {
  PD_TRY(queue_draft(row, rule, prior));
  queued_draws_.pop_back();
  int32_t words[kDrawWords];
  PD_TRY(backend_.download(words, out_.tensor().col_slice(prior * kDrawWords, kDrawWords)));
  PD_TRY(check(words));
  return words[kSampleOutTokens];
}

Status DeviceSampler::queue_verify(const Tensor& logits, const Tensor& draft_rows, const Verifier& verifier,
                                   int top_logprobs) {
  if (queued_rows_ > 0) {
    return make_error(ErrorCode::kInternal, "sampler: a verification is queued and not collected");
  }
  const int rows = static_cast<int>(logits.rows);
  const AcceptRule rule = verifier.rule();
  const bool needs_q = rows > 1 && (rule == AcceptRule::kTokenwise || rule == AcceptRule::kBlock);
  SampleArgs a;
  a.rule = sample_rule(rule);
  a.faulty = verifier.faulty();
  a.target = target_;
  a.draft = draft_;
  a.logits = logits;
  if (needs_q) a.draft_logits = draft_rows;
  a.drafts = drafts_.tensor();
  a.commit = penalised_;
  a.logprobs = top_logprobs < 0 ? -1 : top_logprobs;
  PD_TRY(launch(a, rows, kVerifyOffset));
  queued_rows_ = rows;
  queued_logprobs_ = a.logprobs;
  return Status::ok();
}

Expected<const Verdict*> DeviceSampler::collect() {
  const int rows = queued_rows_;
  const int logprobs = queued_logprobs_;
  const std::vector<int> draws = std::move(queued_draws_);
  queued_draws_.clear();
  queued_rows_ = 0;
  if (rows == 0) return make_error(ErrorCode::kInternal, "sampler: collect() without a queued verification");
  const int64_t end = kVerifyOffset + sample_out_words(rows, logprobs);
  out_host_.resize(static_cast<size_t>(end));
  PD_TRY(backend_.download(out_host_.data(), out_.tensor().col_slice(0, end)));
  for (int prior : draws) PD_TRY(check(out_host_.data() + prior * kDrawWords));
  const int32_t* w = out_host_.data() + kVerifyOffset;
  PD_TRY(check(w));
  Verdict& v = verdict_;
  v.accepted = w[kSampleOutAccepted];
  v.tokens.assign(w + kSampleOutTokens, w + kSampleOutTokens + v.accepted + 1);
  v.logprobs.clear();
  if (logprobs >= 0) {
    const int32_t* lp = w + kSampleOutTokens + rows;
    for (int j = 0; j <= v.accepted; ++j) {
      const int32_t* t = lp + static_cast<int64_t>(j) * (1 + 2 * logprobs);
      TokenLogprobs tl{.token = v.tokens[static_cast<size_t>(j)],
                       .logprob = float_from_bits(static_cast<uint32_t>(t[0])),
                       .top = {}};
      for (int i = 0; i < logprobs && t[1 + 2 * i] >= 0; ++i) {
        tl.top.emplace_back(t[1 + 2 * i], float_from_bits(static_cast<uint32_t>(t[2 + 2 * i])));
      }
      v.logprobs.push_back(std::move(tl));
    }
  }
  return &verdict_;
}

Expected<const Verdict*> DeviceSampler::verify(const Tensor& logits, const Tensor& draft_rows,
                                               const Verifier& verifier, int top_logprobs) {
  PD_TRY(queue_verify(logits, draft_rows, verifier, top_logprobs));
  return collect();
}

}  // namespace pd
