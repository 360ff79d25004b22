// What `bench --synth` (cmd_bench.cpp) and `bench --model` (cmd_bench_model.cpp) share: their arguments, the
// record's common fields (docs/DESIGN.md §7: commit, device, driver, floor) and small statistics.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "puredrive/backend/backend.h"
#include "puredrive/util/status.h"

namespace pd::cli {

// Defaults are --synth's; setup_bench() applies --model's (contexts 2k, 512 tokens, 3 runs, backend auto) to
// the options not given.
struct BenchArgs {
  std::string synth;
  std::string model;
  std::string quant = "bf16";
  uint64_t seed = 0;
  std::string contexts = "2k,32k";
  int tokens = 128;
  int runs = 1;
  int verify_rows = 3;
  int verify_iters = 16;
  int prefill_chunk = 0;      // 0: choose_prefill_chunk (model/memory_plan.h) for the largest cell
  int prefill_runs = 1;       // --synth: prefills of each cell's prompt (their median is reported)
  int profile_steps = 0;      // eager one-row steps timed op by op after the timed phases (CUDA)
  int profile_rows = 1;       // rows of the last profiled step, the one marked for kernel profilers
  int copy_mib = 0;           // 0: 1024 on CUDA, 64 on the CPU
  std::string fill = "real";  // real | synthetic | auto (--synth: synthetic above 64K tokens)
  std::string backend = "cuda";
  int threads = 0;
  std::string json_out;
  std::string markdown_out;  // --synth: a short Markdown summary of the record
  std::string commit;
  std::string note;
  // --model: the draft length of the MTP modes; --synth: 0 (no MTP cycles) unless given (bench_mtp.h).
  int mtp_draft = 2;
  bool mtp_adaptive = true;    // --model: DecodeRequest::adaptive_draft of the MTP modes
  std::string accept_pattern;  // --synth: accepted drafts per cycle, cycled
  double accept_mean = 0;      // --synth: tokens per cycle of a deterministic pattern (0: 2.3, at most k + 1)
  std::string mtp_rule = "greedy";  // --synth: greedy, or seeded (temperature 0.8, top-p 0.95, a seed)
  int mtp_draft_vocab = 0;          // ModelOptions::mtp_draft_vocab
  int mtp_window = 0;               // ModelOptions::mtp_window
  // --model only.
  std::string modes = "greedy,greedy-mtp,sample,sample-mtp";
  int ctx_size = 0;
  std::string prompt_root = ".";
  bool read_weights = false;
  int prompt_text = -1;  // >= 0: print prompt `prompt_text` cut to the first context, as text, and exit
};

using Clock = std::chrono::steady_clock;

[[noreturn]] void bench_fail(const Status& s);
template <typename T>
T bench_check(Expected<T> e) {
  if (!e) bench_fail(e.status());
  return std::move(e).value();
}
inline void bench_check(const Status& s) {
  if (!s) bench_fail(s);
}

// "2k,32k" -> {2048, 32768}.
Expected<std::vector<int>> parse_contexts(const std::string& text);
double seconds(Clock::time_point a, Clock::time_point b);
double median(std::vector<double> v);
double percentile(std::vector<double> v, double p);
std::string utc_now();
// Device-to-device copy bandwidth, counting bytes read plus bytes written (the floor's denominator).
double copy_bandwidth(Backend& be, int64_t bytes);
// {"backend": ..., and on CUDA the device name, compute capability, memory, driver and runtime versions}.
nlohmann::json device_json(const Backend& be);
// Writes `record` to `path` (nothing when empty); rewritten after every cell, so a run cut short keeps its
// finished cells.
void write_record(const std::string& path, const nlohmann::json& record);

// bench --model DIR (cmd_bench_model.cpp).
void run_bench_model(const BenchArgs& a);

}  // namespace pd::cli
