// The CPU backend's sample op (backend.h SampleArgs): the reference functions of sampling.h over the op's
// tensors. Row j's penalties see the history plus drafts[0 .. prior + j); the draft rows q_{i+1} see it plus
// drafts[0 .. i).
#include <unordered_map>

#include "puredrive/backend/cpu/sampling.h"

namespace pd::cpu {
namespace {

using sampling::Penalty;

// history (output count | prompt bit) plus the extra output tokens, as penalty entries.
std::vector<Penalty> penalties_of(const std::vector<Penalty>& base, std::span<const int32_t> extra) {
  std::vector<Penalty> out = base;
  if (extra.empty()) return out;
  std::unordered_map<int32_t, size_t> index;
  for (size_t i = 0; i < out.size(); ++i) index.emplace(out[i].token, i);
  for (int32_t t : extra) {
    auto [it, added] = index.emplace(t, out.size());
    if (added) out.push_back({.token = t, .count = 0, .in_prompt = false});
    ++out[it->second].count;
  }
  return out;
}

void put_status(int32_t* out, SampleStatus s, int32_t a, int32_t b) {
  out[kSampleOutStatus] = static_cast<int32_t>(s);
  out[1] = a;
  out[2] = b;
}

}  // namespace

void sample(const SampleArgs& a) {
  const auto rows = static_cast<int>(a.logits.rows);
  const auto vocab = static_cast<int32_t>(a.logits.cols);
  const int k = rows - 1;
  int32_t* out = a.out.row<int32_t>(0);
  const int64_t out_words = a.out.cols;
  std::fill(out, out + out_words, -1);
  put_status(out, SampleStatus::kOk, 0, 0);
  out[kSampleOutAccepted] = 0;

  const int draft_count = a.prior + k;
  const int32_t* drafts = draft_count > 0 || a.write_draft ? a.drafts.row<int32_t>(0) : nullptr;
  for (int i = 0; i < draft_count; ++i) {
    if (drafts[i] < 0 || drafts[i] >= vocab) return put_status(out, SampleStatus::kBadToken, i, drafts[i]);
  }
  const int64_t* control = a.control.row<int64_t>(0);

  std::vector<sampling::LogitBias> bias;
  if (!a.bias.empty()) {
    const float* b = a.bias.row<float>(0);
    for (int32_t t = 0; t < vocab; ++t) {
      if (b[t] != 0.0f) bias.push_back({t, b[t]});
    }
  }
  std::vector<Penalty> base;
  int32_t* history = a.history.empty() ? nullptr : a.history.row<int32_t>(0);
  if (history != nullptr) {
    for (int32_t t = 0; t < vocab; ++t) {
      if (history[t] != 0) {
        base.push_back({.token = t,
                        .count = history[t] & (kHistoryPromptBit - 1),
                        .in_prompt = (history[t] & kHistoryPromptBit) != 0});
      }
    }
  }

  const bool needs_q = k > 0 && (a.rule == SampleRule::kTokenwise || a.rule == SampleRule::kBlock);
  std::vector<TokenDistribution> target(static_cast<size_t>(rows));
  std::vector<TokenDistribution> draft(needs_q ? static_cast<size_t>(k) : 0);
  for (int r = 0; r < rows + static_cast<int>(draft.size()); ++r) {
    const bool is_target = r < rows;
    const int j = is_target ? r : r - rows;
    const Tensor& src = is_target ? a.logits : a.draft_logits;
    const std::span<const float> row(src.row<float>(j), static_cast<size_t>(vocab));
    const std::span<const int32_t> extra(
        drafts, drafts == nullptr ? 0 : static_cast<size_t>(is_target ? a.prior + j : j));
    const std::vector<Penalty> pen = penalties_of(base, extra);
    const sampling::RowStatus s = sampling::process_row(row, is_target ? a.target : a.draft, bias, pen,
                                                        is_target ? &target[j] : &draft[j]);
    if (!s.ok()) return put_status(out, s.status, r, s.token);
  }

  std::vector<double> uniforms(static_cast<size_t>(rows));
  for (int j = 0; j < rows; ++j) {
    uniforms[j] = double_from_bits(static_cast<uint64_t>(control[kControlUniforms + j]));
  }
  const sampling::AcceptOutcome acc =
      sampling::accept({.rule = a.rule,
                        .faulty = a.faulty,
                        .drafts = std::span<const int32_t>(drafts == nullptr ? nullptr : drafts + a.prior,
                                                           static_cast<size_t>(k)),
                        .target = target,
                        .draft = draft,
                        .uniforms = uniforms,
                        .seed = static_cast<uint64_t>(control[kControlSeed]),
                        .first_position = control[kControlPosition]});
  if (acc.status != SampleStatus::kOk) return put_status(out, acc.status, acc.detail, 0);

  out[kSampleOutAccepted] = acc.accepted;
  int32_t* tokens = out + kSampleOutTokens;
  for (int j = 0; j < acc.accepted; ++j) tokens[j] = drafts[a.prior + j];
  tokens[acc.accepted] = acc.next;
  if (a.write_draft) a.drafts.row<int32_t>(0)[a.prior] = acc.next;
  if (a.commit) {
    for (int j = 0; j <= acc.accepted; ++j) ++history[tokens[j]];
  }
  if (a.logprobs >= 0) {
    int32_t* lp = tokens + rows;
    for (int j = 0; j <= acc.accepted; ++j) {
      const std::span<const float> row(a.logits.row<float>(j), static_cast<size_t>(vocab));
      const double log_z = sampling::raw_log_normaliser(row);
      int32_t* w = lp + static_cast<int64_t>(j) * (1 + 2 * a.logprobs);
      w[0] = static_cast<int32_t>(float_bits(sampling::raw_logprob(row, log_z, tokens[j])));
      const std::vector<int32_t> top = sampling::top_logit_ids(row, a.logprobs);
      for (size_t i = 0; i < top.size(); ++i) {
        w[1 + 2 * i] = top[i];
        w[2 + 2 * i] = static_cast<int32_t>(float_bits(sampling::raw_logprob(row, log_z, top[i])));
      }
    }
  }
}

}  // namespace pd::cpu
