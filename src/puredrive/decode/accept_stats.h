// Acceptance accounting of speculative decoding: tokens per cycle, acceptance per draft position, and the
// time spent drafting and verifying (filled in by the generator). Reported by `generate --stats`, the
// server's metrics and the benchmark.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pd {

struct AcceptStats {
  int64_t cycles = 0;                // verify passes
  int64_t drafted = 0;               // draft tokens proposed
  int64_t accepted = 0;              // draft tokens accepted
  std::vector<int64_t> proposed_at;  // [j]: cycles that proposed a draft at position j (0-based)
  std::vector<int64_t> accepted_at;  // [j]: cycles that accepted the draft at position j
  std::vector<int64_t> length_hist;  // [a]: cycles that accepted exactly a drafts
  double draft_seconds = 0.0;
  double verify_seconds = 0.0;

  // One cycle that proposed num_drafts tokens and accepted the first num_accepted.
  void record(int num_drafts, int num_accepted);
  void merge(const AcceptStats& other);

  int64_t emitted() const { return accepted + cycles; }  // every cycle adds the correction/bonus token
  double tokens_per_cycle() const;
  double acceptance_rate() const;             // accepted / drafted
  double acceptance_rate_at(size_t j) const;  // accepted_at[j] / proposed_at[j]
  double mean_accepted() const;               // accepted / cycles

  // "cycles=… tokens/cycle=2.31 accepted=… (71.2%) per position: 88.0% 69.1% …"
  std::string summary() const;
};

}  // namespace pd
