// Steps `bench --synth` (cmd_bench.cpp) runs outside its timed phases: a recorded step with its argmax, and
// the row-exactness check at the model's real dimensions that every record carries.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_common.h"
#include "cli/synth_model.h"
#include "puredrive/model/model.h"

namespace pd::cli {

// One recorded step: forward over tokens (positions continue the state), argmax of the requested logits rows
// on the device into ids, then the ids are downloaded (the only host synchronisation).
std::vector<int32_t> run_step(Model& m, SequenceState& st, std::span<const int32_t> tokens, LogitRows rows,
                              const Buffer& ids, bool prefill = false);

// Row-exactness at the model's real dimensions: an R-row verify step (R = a.verify_rows) gives bitwise what
// R one-row steps give (the logits of every row, the KV entries, every GDN conv and recurrent state), from
// two states filled by the same prefill of 64 tokens, or by the same synthetic fill of `synthetic` tokens (a
// long context, whose attention has many splits). The record's row_exact_check object.
nlohmann::json row_exact_check(const BenchArgs& a, Model& m, const SynthModel& sm, int synthetic = 0);

}  // namespace pd::cli
