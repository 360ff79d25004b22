// `bench --synth ARCH --mtp-draft K`: full MTP cycles at the 35B shape (docs/DESIGN.md §7), through the
// generator's own cycle (decode/cycle_runner.h): K draft steps of the MTP head, one (K+1)-row verify step,
// acceptance by the sample op, rollback of the rejected rows, one host synchronisation per cycle. Random
// weights never agree with their MTP head, so the acceptance is scripted (the deviation §7 allows,
// `acceptance: scripted`): the head still runs every draft step and draw, then its drafts are replaced by the
// tokens plain decoding produced from the same state, right for a scripted number of positions per cycle and
// wrong after, so the sample op accepts exactly that many and the state rolls back the rest. The cell
// reports cycle time, effective tok/s, the plain step through the same code in the same run, and the cycle's
// floor: the bytes of K draft steps and one verify step over the measured copy bandwidth.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_common.h"
#include "cli/synth_model.h"
#include "puredrive/model/model.h"

namespace pd::cli {

// Accepted drafts per cycle: a list cycled (--accept-pattern 2,1,2), or for a mean of m tokens per cycle
// (--accept-mean) the deterministic sequence a_i = floor((i + 1) (m - 1)) - floor(i (m - 1)).
struct AcceptPattern {
  std::vector<int> list;
  double mean_tokens = 0;  // used when list is empty
  int at(int64_t cycle) const;
  std::string describe() const;
};

// From --accept-pattern / --accept-mean for draft length k (default: 2.3 tokens per cycle, at most k + 1).
Expected<AcceptPattern> make_accept_pattern(const BenchArgs& a, int k);

// One cell's MTP cycles. `filled` holds the context (its length); x_n is the token at the next position.
// Works on copies: `filled` is left as it is.
nlohmann::json run_mtp_cell(const BenchArgs& a, Model& m, const SynthModel& sm, const SequenceState& filled,
                            int32_t x_n, double bandwidth);

// The cells' MTP cycles as a table on stdout (nothing when the record has none).
void print_mtp_table(const nlohmann::json& record);
// A short Markdown summary of a `bench --synth` record (docs/DESIGN.md §7: the JSON's companion in
// bench/results/): what ran, then per cell decode, floor, verify and, with --mtp-draft, the MTP cycle.
// Nothing when path is empty.
void write_synth_markdown(const std::string& path, const nlohmann::json& record);

}  // namespace pd::cli
