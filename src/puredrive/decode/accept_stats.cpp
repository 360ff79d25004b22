#include "puredrive/decode/accept_stats.h"

#include <fmt/format.h>

#include "puredrive/util/status.h"

namespace pd {
namespace {

double ratio(int64_t num, int64_t den) {
  return den > 0 ? static_cast<double>(num) / static_cast<double>(den) : 0.0;
}

void add_into(std::vector<int64_t>& dst, const std::vector<int64_t>& src) {
  if (dst.size() < src.size()) dst.resize(src.size(), 0);
  for (size_t i = 0; i < src.size(); ++i) dst[i] += src[i];
}

}  // namespace

void AcceptStats::record(int num_drafts, int num_accepted) {
  PD_ASSERT(num_drafts >= 0 && num_accepted >= 0 && num_accepted <= num_drafts, "AcceptStats::record({}, {})",
            num_drafts, num_accepted);
  const auto k = static_cast<size_t>(num_drafts);
  if (proposed_at.size() < k) {
    proposed_at.resize(k, 0);
    accepted_at.resize(k, 0);
  }
  if (length_hist.size() < k + 1) length_hist.resize(k + 1, 0);
  ++cycles;
  drafted += num_drafts;
  accepted += num_accepted;
  for (size_t j = 0; j < k; ++j) ++proposed_at[j];
  for (int j = 0; j < num_accepted; ++j) ++accepted_at[j];
  ++length_hist[num_accepted];
}

void AcceptStats::merge(const AcceptStats& other) {
  cycles += other.cycles;
  drafted += other.drafted;
  accepted += other.accepted;
  add_into(proposed_at, other.proposed_at);
  add_into(accepted_at, other.accepted_at);
  add_into(length_hist, other.length_hist);
  draft_seconds += other.draft_seconds;
  verify_seconds += other.verify_seconds;
}

double AcceptStats::tokens_per_cycle() const {
  return ratio(emitted(), cycles);
}
double AcceptStats::acceptance_rate() const {
  return ratio(accepted, drafted);
}
double AcceptStats::mean_accepted() const {
  return ratio(accepted, cycles);
}

double AcceptStats::acceptance_rate_at(size_t j) const {
  return j < proposed_at.size() ? ratio(accepted_at[j], proposed_at[j]) : 0.0;
}

std::string AcceptStats::summary() const {
  std::string s = fmt::format("cycles={} tokens/cycle={:.3f} accepted={}/{} ({:.1f}%) per position:", cycles,
                              tokens_per_cycle(), accepted, drafted, 100.0 * acceptance_rate());
  for (size_t j = 0; j < proposed_at.size(); ++j) s += fmt::format(" {:.1f}%", 100.0 * acceptance_rate_at(j));
  if (draft_seconds > 0.0 || verify_seconds > 0.0) {
    s += fmt::format(" draft={:.3f}s verify={:.3f}s", draft_seconds, verify_seconds);
  }
  return s;
}

}  // namespace pd
