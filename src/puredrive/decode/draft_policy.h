// DraftPolicy: how many drafts the next MTP cycle of a request verifies (DecodeRequest::adaptive_draft).
//
// A cycle pays only when the tokens it is expected to emit outweigh what it costs against plain steps. That
// depends on the text and on the machine: the tiny coder on the CPU verifies 3 rows in about 2.5 one-row
// steps, and on prompts whose drafts are rarely accepted MTP decodes slower than plain steps, on the CPU and
// on the GPU (bench/cpu.md; bench/results/2026-12-04-h200-fd7e4fd.md). The policy estimates, from the
// request's own recent steps:
//   - a_j, the chance that draft j is accepted once drafts 1..j-1 were (decayed counts, an optimistic prior
//     so that a request starts by drafting);
//   - the seconds of a plain step and of a cycle of each k (moving averages; the first sample of each is
//     left out: on the GPU it records the step's graph; so is a lone sample over twice the average: a cycle
//     records a graph of its own the first time it follows each count of kept drafts; and a sample under
//     half the average replaces it, which then held such a recording);
// and picks the k in 0..max_draft (0: a plain step) with the most expected tokens per second,
// E(k) / t(k) with E(k) = 1 + a_1 + a_1 a_2 + ... + a_1..a_k. While it decodes plainly it learns nothing
// about acceptance, so after kProbeEvery plain steps it drafts once more at max_draft, and after twice as
// many each time such a probe did not bring drafting back (up to kProbeMax): a probe costs a cycle, and the
// MTP head then catches up on every row it skipped (on the CPU, about an eighth of a step each for the tiny
// coder). While it drafts, the plain step's time goes stale (a busy machine may have inflated it), so every
// kRetimeEvery cycles it takes one plain step.
//
// Which k a cycle uses never changes the emitted tokens (docs/DESIGN.md §4.3: greedy and seeded outputs are
// the same with any drafts or none; token-wise and block acceptance stay distribution-exact), only the
// speed. The choice depends on measured times, so it may differ from run to run; the tokens do not.
#pragma once

#include <vector>

namespace pd {

class DraftPolicy {
 public:
  static constexpr int kProbeEvery = 16;   // plain steps before a probing cycle
  static constexpr int kProbeMax = 256;    // ... after failed probes
  static constexpr int kRetimeEvery = 32;  // cycles between two plain steps that retime it
  static constexpr double kDecay = 0.9;    // weight of the older acceptance counts at each cycle
  static constexpr double kPriorAccept = 0.8;
  static constexpr double kPriorWeight = 2.0;  // cycles' worth of the prior
  static constexpr double kTimeWeight = 0.2;   // weight of the newest time in its moving average
  // A time over kOutlier x its average is left out, unless kOutlierRun such times came in a row.
  static constexpr double kOutlier = 2.0;
  static constexpr int kOutlierRun = 3;

  explicit DraftPolicy(int max_draft);

  // The k for the next step, 0..max_draft.
  int next() const;
  // A cycle of k >= 1 drafts, `accepted` of them kept, took `seconds` (from queueing it to its verdict).
  void record_cycle(int k, int accepted, double seconds);
  void record_plain(double seconds);

  // The estimates (tests, --stats): a_j for j = 1..max_draft, the expected tokens of a cycle of k.
  double accept_chance(int j) const;
  double expected_tokens(int k) const;

 private:
  struct Timing {
    int samples = 0;  // including the one left out
    double seconds = 0;
    int outliers = 0;  // slow times in a row
    bool known() const { return samples >= 2; }
  };
  void record_time(Timing& t, double seconds);
  // t(k) measured, or for a k not yet timed interpolated between the plain step and max_draft's cycle;
  // negative when neither end is known.
  double seconds_of(int k) const;

  int max_draft_;
  std::vector<double> reached_, accepted_;  // [j - 1]: decayed counts of cycles that reached / kept draft j
  std::vector<Timing> times_;               // [k]: 0 = plain step
  int plain_run_ = 0;                       // plain steps since the last cycle
  int probe_every_ = kProbeEvery;           // plain steps before the next probe
  bool probed_ = false;                     // the last cycle was a probe
  int cycle_run_ = 0;                       // cycles since the last plain step
};

}  // namespace pd
