#include "puredrive/decode/draft_policy.h"

#include <algorithm>

#include "puredrive/util/status.h"

namespace pd {

DraftPolicy::DraftPolicy(int max_draft)
    : max_draft_(max_draft),
      reached_(static_cast<size_t>(max_draft), kPriorWeight),
      accepted_(static_cast<size_t>(max_draft), kPriorWeight * kPriorAccept),
      times_(static_cast<size_t>(max_draft) + 1) {
  PD_ASSERT(max_draft >= 0, "DraftPolicy({})", max_draft);
}

int DraftPolicy::next() const {
  if (max_draft_ == 0) return 0;
  // First the full cycle's time, then the plain step's, each over two samples.
  if (!times_[static_cast<size_t>(max_draft_)].known()) return max_draft_;
  if (!times_[0].known()) return 0;
  if (plain_run_ >= probe_every_) return max_draft_;
  if (cycle_run_ >= kRetimeEvery) return 0;
  int best = 0;
  double best_rate = 1.0 / seconds_of(0);
  for (int k = 1; k <= max_draft_; ++k) {
    const double rate = expected_tokens(k) / seconds_of(k);
    if (rate > best_rate) {
      best = k;
      best_rate = rate;
    }
  }
  return best;
}

void DraftPolicy::record_cycle(int k, int accepted, double seconds) {
  PD_ASSERT(k >= 1 && k <= max_draft_ && accepted >= 0 && accepted <= k, "DraftPolicy::record_cycle({}, {})",
            k, accepted);
  for (size_t j = 0; j < reached_.size(); ++j) {
    reached_[j] *= kDecay;
    accepted_[j] *= kDecay;
  }
  // Draft j was judged when drafts 1..j-1 were kept.
  for (int j = 1; j <= k && j <= accepted + 1; ++j) {
    reached_[static_cast<size_t>(j - 1)] += 1.0;
    if (j <= accepted) accepted_[static_cast<size_t>(j - 1)] += 1.0;
  }
  record_time(times_[static_cast<size_t>(k)], seconds);
  probed_ = plain_run_ >= probe_every_;
  if (!probed_ && plain_run_ > 0) probe_every_ = kProbeEvery;  // drafting pays again
  plain_run_ = 0;
  ++cycle_run_;
}

void DraftPolicy::record_plain(double seconds) {
  record_time(times_[0], seconds);
  if (probed_) probe_every_ = std::min(2 * probe_every_, kProbeMax);  // the probe did not pay
  probed_ = false;
  ++plain_run_;
  cycle_run_ = 0;
}

double DraftPolicy::accept_chance(int j) const {
  PD_ASSERT(j >= 1 && j <= max_draft_, "DraftPolicy::accept_chance({})", j);
  return accepted_[static_cast<size_t>(j - 1)] / reached_[static_cast<size_t>(j - 1)];
}

double DraftPolicy::expected_tokens(int k) const {
  double tokens = 1.0, kept = 1.0;
  for (int j = 1; j <= k; ++j) {
    kept *= accept_chance(j);
    tokens += kept;
  }
  return tokens;
}

void DraftPolicy::record_time(Timing& t, double seconds) {
  ++t.samples;
  if (t.samples == 1) return;  // the first: a graph recording on the GPU
  if (t.samples == 2) {
    t.seconds = seconds;
    return;
  }
  if (seconds * kOutlier < t.seconds) {  // the average held a recording: start again from this time
    t.seconds = seconds;
    t.outliers = 0;
    return;
  }
  const bool slow = seconds > kOutlier * t.seconds;
  if (slow && ++t.outliers < kOutlierRun) return;
  if (!slow) t.outliers = 0;
  t.seconds = (1.0 - kTimeWeight) * t.seconds + kTimeWeight * seconds;
}

double DraftPolicy::seconds_of(int k) const {
  const Timing& t = times_[static_cast<size_t>(k)];
  if (t.known()) return t.seconds;
  const Timing& plain = times_[0];
  const Timing& top = times_[static_cast<size_t>(max_draft_)];
  if (!plain.known() || !top.known()) return -1.0;
  return plain.seconds + (top.seconds - plain.seconds) * k / max_draft_;
}

}  // namespace pd
