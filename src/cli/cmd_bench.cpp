// puredrive bench: the benchmark protocol of docs/DESIGN.md §7 for a synthetic model (random weights, real
// shapes): per context, fill the KV cache and GDN states by a real prefill, then decode greedily
// (non-speculative) and report tok/s beside the floor (bytes per decode step / device-to-device copy
// bandwidth measured in the same run), and the time of an R-row verify step relative to a one-row step. JSON
// + a table.
//
// Deviations from §7, recorded in the JSON: the prefill uses seeded random token ids (random weights have no
// tokenizer), and one run per cell by default (--runs). With --fill synthetic (or auto, above 64K tokens) a
// cell's KV cache and GDN states are filled with random values instead of a prefill (`fill: synthetic`, the
// deviation §7 allows for random weights; prefill speed then comes from the real-fill cells). Per cell, the
// decode-attention bytes per step (K and V read at the profiled positions) and their achieved bandwidth over
// the attention op's device time in the profiled steps (--profile-steps). With --mtp-draft K each cell also
// times MTP cycles with a scripted acceptance (bench_mtp.h) from a copy of its filled state.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli/bench_common.h"
#include "cli/bench_mtp.h"
#include "cli/bench_steps.h"
#include "cli/command.h"
#include "cli/synth_model.h"
#include "puredrive/backend/backend.h"
#include "puredrive/model/memory_plan.h"
#include "puredrive/model/model.h"
#include "puredrive/model/synthetic_fill.h"
#ifdef PD_HAVE_CUDA
#include "puredrive/backend/cuda/cuda_backend.h"
#endif

namespace pd::cli {
namespace {

[[noreturn]] void fail(const Status& s) {
  bench_fail(s);
}
template <typename T>
T check(Expected<T> e) {
  return bench_check(std::move(e));
}
void check(const Status& s) {
  bench_check(s);
}

// --fill auto: contexts above this take the synthetic fill (a real prefill of 128K tokens does not fit a
// device slot); 64K and below keep the real prefill, whose speed the record reports.
constexpr int kAutoSyntheticFrom = 65536;

bool synthetic_fill_for(const std::string& fill, int context) {
  return fill == "synthetic" || (fill == "auto" && context > kAutoSyntheticFrom);
}

nlohmann::json run_context(const BenchArgs& a, Model& m, const SynthModel& sm, int context,
                           double bandwidth) {
  Backend& be = m.backend();
  const int V = sm.config.vocab_size;
  const int verify_tokens = (a.verify_iters + 2) * 3;  // one-row, R-row, R-row of different tokens
  SequenceState st = check(
      m.new_state({.ctx_size = context + a.tokens + verify_tokens + a.profile_steps + a.profile_rows + 16,
                   .kv_dtype = DType::kBF16,
                   .max_rows = std::max(8, a.verify_rows)}));
  Buffer ids = check(be.alloc(DType::kI32, std::max(8, a.prefill_chunk), 1));
  const std::vector<int32_t> prompt = synth_tokens(sm.seed + static_cast<uint64_t>(context), V, context);

  // Prefill in chunks of max_rows rows; only the last chunk produces logits. The synthetic fill writes the
  // state directly and starts decoding from a seeded token.
  const bool synthetic = synthetic_fill_for(a.fill, context);
  std::vector<int32_t> last;
  // One prefill of the prompt into `s`, timed to the device's end; `mark`: its last chunk is marked for
  // kernel-level profilers (compare.sh PD_NCU_PREFILL).
  auto prefill = [&](SequenceState& s, [[maybe_unused]] bool mark) {
    const auto p0 = Clock::now();
    const int chunk = m.max_rows();
    for (int begin = 0; begin < context; begin += chunk) {
      const int n = std::min(chunk, context - begin);
      const bool final_chunk = begin + n == context;
#ifdef PD_HAVE_CUDA
      if (mark && final_chunk && be.device() == Device::kCuda) cuda_range_push("pd_prefill_chunk");
#endif
      last = run_step(m, s, std::span(prompt).subspan(static_cast<size_t>(begin), static_cast<size_t>(n)),
                      final_chunk ? LogitRows::kLast : LogitRows::kNone, ids, /*prefill=*/true);
#ifdef PD_HAVE_CUDA
      if (mark && final_chunk && be.device() == Device::kCuda) cuda_range_pop();
#endif
      if ((begin / chunk + 1) % 1024 == 0) {
        fmt::print(stderr, "  prefill {}/{} tokens, {:.1f} s\n", begin + n, context,
                   seconds(p0, Clock::now()));
      }
    }
    check(be.synchronize());
    return seconds(p0, Clock::now());
  };
  // --prefill-runs N: N - 1 prefills into scratch states first (one at a time), then the cell's own; the
  // median is the cell's prefill time, so that one call resolves differences of a few percent.
  std::vector<double> prefill_runs;
  double prefill_s = 0;
  if (synthetic) {
    const auto p0 = Clock::now();
    check(fill_synthetic(be, st, context, sm.seed + static_cast<uint64_t>(context)));
    last = {prompt.back()};
    check(be.synchronize());
    prefill_s = seconds(p0, Clock::now());
  } else {
    for (int r = 1; r < a.prefill_runs; ++r) {
      SequenceState scratch =
          check(m.new_state({.ctx_size = context + 16, .kv_dtype = DType::kBF16, .max_rows = st.max_rows()}));
      prefill_runs.push_back(prefill(scratch, false));
    }
    prefill_runs.push_back(prefill(st, true));
    prefill_s = median(prefill_runs);
  }
  // MTP cycles from a copy of the filled state, before the plain decode moves it on.
  nlohmann::json mtp;
  if (a.mtp_draft > 0) mtp = run_mtp_cell(a, m, sm, st, last.at(0), bandwidth);

  // Non-speculative greedy decode: one row per step, each token fed back from the device argmax.
  int32_t tok = last.at(0);
#ifdef PD_HAVE_CUDA
  const std::optional<CudaStepStats> stats0 = cuda_step_stats(be);
#endif
  std::vector<int32_t> generated;
  std::vector<double> step_s;
#ifdef PD_HAVE_CUDA
  if (be.device() == Device::kCuda) cuda_trace_window(true);
#endif
  const auto d0 = Clock::now();
  for (int i = 0; i < a.tokens; ++i) {
    const auto s0 = Clock::now();
    tok = run_step(m, st, std::span(&tok, 1), LogitRows::kLast, ids).at(0);
    step_s.push_back(seconds(s0, Clock::now()));
    generated.push_back(tok);
  }
  const double decode_s = seconds(d0, Clock::now());
#ifdef PD_HAVE_CUDA
  if (be.device() == Device::kCuda) cuda_trace_window(false);
#endif
  nlohmann::json graph;
#ifdef PD_HAVE_CUDA
  if (std::optional<CudaStepStats> s = cuda_step_stats(be); s && stats0) {
    // Host recording time and device (graph) time per decode step; a graph's device time is read at the next
    // begin_step(), so the average is over the decode steps give or take one.
    const double steps = static_cast<double>(s->recorded_steps - stats0->recorded_steps);
    graph = {{"nodes_in_decode_graph", s->last_graph_nodes},
             {"graphs_captured", s->graphs_captured},
             {"graph_replays", s->graph_replays},
             {"eager_steps", s->eager_steps},
             {"host_record_ms_per_step",
              steps > 0 ? 1e3 * (s->record_seconds - stats0->record_seconds) / steps : 0.0},
             {"graph_gpu_ms_per_step", s->timed_graphs > stats0->timed_graphs
                                           ? 1e3 * (s->graph_seconds - stats0->graph_seconds) /
                                                 static_cast<double>(s->timed_graphs - stats0->timed_graphs)
                                           : 0.0}};
  }
#endif

  // Verify-step cost: R rows (all logits + argmax) against one row; the R-row step is rolled back to its
  // first row (GDN snapshot restore), as after a fully rejected draft. With one token repeated, the rows of
  // random weights share more experts than a real verify step's rows; with different tokens (`distinct`)
  // their experts are close to independent, fewer shared than a real model's. The two bracket a real
  // verify step (docs/DESIGN.md §8, "Which experts the bench's multi-row steps read").
  auto time_rows = [&](int rows, bool distinct) {
    std::vector<double> t;
    std::vector<int32_t> toks(static_cast<size_t>(rows), tok);
    for (int i = 1; distinct && i < rows; ++i) {
      toks[static_cast<size_t>(i)] = static_cast<int32_t>((int64_t{tok} + int64_t{7919} * i) % V);
    }
    for (int it = 0; it < a.verify_iters + 2; ++it) {
      const auto s0 = Clock::now();
      run_step(m, st, toks, LogitRows::kAll, ids);
      const double dt = seconds(s0, Clock::now());
      if (it >= 2) t.push_back(dt);
      if (rows > 1) check(st.rewind(st.length() - (rows - 1)));
    }
    return median(t);
  };
  // Distinct experts per step of each width (CUDA): a verify step's rows select different experts, so its
  // floor is its own bytes, not the one-row step's.
  auto experts_per_step = [&](int64_t before, int64_t after) {
    return static_cast<double>(after - before) / (a.verify_iters + 2);
  };
  int64_t e0 = 0, e1 = 0, e2 = 0, e3 = 0;
  const bool count_experts = be.device() == Device::kCuda;
#ifdef PD_HAVE_CUDA
  if (count_experts) e0 = check(cuda_moe_experts_read(be));
#endif
  const double r1 = time_rows(1, false);
#ifdef PD_HAVE_CUDA
  if (count_experts) e1 = check(cuda_moe_experts_read(be));
  // A trace build records these steps too (bench/device/trace_summary.py --rows R).
  if (be.device() == Device::kCuda) cuda_trace_window(true);
#endif
  const double rn = time_rows(a.verify_rows, false);
#ifdef PD_HAVE_CUDA
  if (be.device() == Device::kCuda) cuda_trace_window(false);
  if (count_experts) e2 = check(cuda_moe_experts_read(be));
#endif
  const double rd = time_rows(a.verify_rows, true);
#ifdef PD_HAVE_CUDA
  if (count_experts) e3 = check(cuda_moe_experts_read(be));
#endif
  nlohmann::json verify = {{"rows", a.verify_rows},
                           {"r1_ms", 1e3 * r1},
                           {"rn_ms", 1e3 * rn},
                           {"ratio", rn / r1},
                           {"rn_distinct_ms", 1e3 * rd},
                           {"ratio_distinct", rd / r1},
                           {"rows_are", "ratio: one token repeated; ratio_distinct: different tokens"}};
  if (count_experts) {
    // One step's bytes with the experts it read; the R-row step also writes R GDN state snapshots.
    const StepBytes& sb = sm.step_bytes;
    const double expert_bytes =
        static_cast<double>(sb.experts_active) /
        static_cast<double>(sm.config.num_experts_per_tok * sm.config.num_hidden_layers);
    const double x1 = experts_per_step(e0, e1), xn = experts_per_step(e1, e2), xd = experts_per_step(e2, e3);
    const double base = static_cast<double>(sb.at_context(context) - sb.experts_active);
    const double b1 = base + x1 * expert_bytes;
    const double snapshots = static_cast<double>(a.verify_rows) * sb.gdn_state / 2;
    verify["experts_per_step"] = {{"r1", x1}, {"rn", xn}, {"rn_distinct", xd}};
    verify["floor_ratio"] = (base + xn * expert_bytes + snapshots) / b1;
    verify["floor_ratio_distinct"] = (base + xd * expert_bytes + snapshots) / b1;
  }

  // Where a decode step's device time goes: a few eager one-row steps with every op timed by events.
  nlohmann::json profile = nlohmann::json::array();
  const int profile_from = st.length();  // position of the first profiled step
  double attention_s = 0, profiled_s = 0;
#ifdef PD_HAVE_CUDA
  if (a.profile_steps > 0 && be.device() == Device::kCuda) {
    set_cuda_op_profiling(be, true);
    for (int i = 0; i < a.profile_steps; ++i) {
      // The last profiled step is marked for kernel-level profilers (bench/device/run.sh runs ncu on it).
      // With --profile-rows R > 1 that step is an R-row verify step, left out of the op profile.
      const bool marked = i + 1 == a.profile_steps;
      const int rows = marked ? a.profile_rows : 1;
      if (marked && rows > 1) set_cuda_op_profiling(be, false);
      if (marked) cuda_range_push("pd_decode_step");
      std::vector<int32_t> pos(rows), toks(rows, tok);
      std::iota(pos.begin(), pos.end(), st.length());
      Expected<StepOutput> o = m.forward(st, toks, pos, {.logits = LogitRows::kLast, .tap = {}});
      if (!o) fail(o.status());
      check(be.argmax({.x = o->logits, .out = ids.row_slice(0, 1)}));
      if (marked) {
        check(be.synchronize());
        cuda_range_pop();
      }
    }
    check(be.synchronize());
    set_cuda_op_profiling(be, false);
    double total = 0;
    for (const CudaOpTime& t : cuda_op_profile(be)) {
      total += t.seconds;
      if (t.label == "gated_attention") attention_s += t.seconds;
    }
    profiled_s = total;
    for (const CudaOpTime& t : cuda_op_profile(be)) {
      profile.push_back({{"op", t.label},
                         {"calls_per_step", static_cast<double>(t.count) / a.profile_steps},
                         {"ms_per_step", 1e3 * t.seconds / a.profile_steps},
                         {"share", total > 0 ? t.seconds / total : 0.0}});
    }
  }
#endif

  const int64_t bytes = sm.step_bytes.at_context(context);
  const double floor_tps = bandwidth / static_cast<double>(bytes);
  const double tps = static_cast<double>(a.tokens) / decode_s;
  // Decode attention: the profiled step at position p reads the K and V of keys [0, p] in every attention
  // layer; achieved bandwidth = those bytes / the attention op's device time (qk norm + RoPE + cache write,
  // split-K partials, merge with the gate), both per profiled step.
  const double keys = a.profile_steps > 0 ? profile_from + 0.5 * (a.profile_steps - 1) + 1 : context + 1.0;
  const double attention_bytes = static_cast<double>(sm.step_bytes.kv_per_token) * keys;
  nlohmann::json attention = {{"kv_bytes_per_step", attention_bytes},
                              {"at_keys", keys},
                              {"how",
                               "K+V bytes of keys [0, p] over all attention layers / attention op device "
                               "time, eager one-row steps of the op profile"}};
  if (attention_s > 0) {
    const double per_step = attention_s / a.profile_steps;
    attention["ms_per_step"] = 1e3 * per_step;
    attention["bandwidth_bytes_per_second"] = attention_bytes / per_step;
    attention["share_of_profiled_step"] = attention_s / profiled_s;
  }
  const double prefill_tps = synthetic ? 0.0 : context / prefill_s;
  return {{"context", context},
          {"fill", synthetic ? "synthetic" : "real"},
          {"prefill_tokens", synthetic ? 0 : context},
          {"prefill_seconds", synthetic ? nlohmann::json(nullptr) : nlohmann::json(prefill_s)},
          {"prefill_runs_seconds", prefill_runs},
          {"fill_seconds", synthetic ? nlohmann::json(prefill_s) : nlohmann::json(nullptr)},
          {"prefill_tokens_per_second", synthetic ? nlohmann::json(nullptr) : nlohmann::json(prefill_tps)},
          {"decode_attention", attention},
          {"decode_tokens", a.tokens},
          {"decode_seconds", decode_s},
          {"decode_tokens_per_second", tps},
          {"step_ms_median", 1e3 * median(step_s)},
          {"step_ms_p90", 1e3 * percentile(step_s, 0.9)},
          {"bytes_per_step", bytes},
          {"floor_tokens_per_second", floor_tps},
          {"fraction_of_floor", tps / floor_tps},
          {"verify", verify},
          {"mtp_cycle", mtp},
          {"cuda_graphs", graph},
          {"op_profile", profile},
          {"first_tokens", std::vector<int32_t>(generated.begin(),
                                                generated.begin() + std::min<size_t>(16, generated.size()))}};
}

void run_bench(BenchArgs a) {
  if (!a.model.empty() && !a.synth.empty()) {
    fail(make_error(ErrorCode::kInvalidArgument, "bench takes --synth ARCH or --model DIR, not both"));
  }
  if (!a.model.empty()) return run_bench_model(a);
  if (a.synth.empty())
    fail(make_error(ErrorCode::kInvalidArgument, "bench needs --synth ARCH or --model DIR"));
  const std::vector<int> contexts = check(parse_contexts(a.contexts));
  // The verify step's rows get all logits (max_logit_rows 8 below).
  if (a.mtp_draft > 7) fail(make_error(ErrorCode::kInvalidArgument, "bench --synth takes --mtp-draft 1..7"));
  if (a.mtp_draft > 0) (void)check(make_accept_pattern(a, a.mtp_draft));
  // Declared first: the model and the synthetic weights are destroyed before the backend.
  std::unique_ptr<Backend> owner = check(create_backend({.name = a.backend, .threads = a.threads}));
  Backend& be = *owner;
  const int copy_mib = a.copy_mib > 0 ? a.copy_mib : (be.device() == Device::kCuda ? 1024 : 64);
  const double bandwidth = copy_bandwidth(be, int64_t{copy_mib} << 20);

  const auto b0 = Clock::now();
  const int64_t available = be.available_memory();  // before the weights, as a session plans
  std::unique_ptr<SynthModel> sm =
      check(make_synth_model(a.synth, a.quant, a.seed, be.device() == Device::kCpu));
  if (a.prefill_chunk == 0) {
    a.prefill_chunk =
        choose_prefill_chunk(sm->config, be.device() != Device::kCpu,
                             *std::max_element(contexts.begin(), contexts.end()), available, 0, 8);
  }
  std::unique_ptr<Model> model = check(create_model(sm->config, sm->weights, be,
                                                    {.max_rows = a.prefill_chunk,
                                                     .max_logit_rows = 8,
                                                     .mtp_draft_vocab = a.mtp_draft_vocab,
                                                     .mtp_window = a.mtp_window}));
  check(be.synchronize());
  const double build_s = seconds(b0, Clock::now());

  const nlohmann::json device = device_json(be);
  // Schema 2: per-cell fill and decode_attention; prefill fields are null in synthetic-fill cells. Schema 3:
  // per-cell mtp_cycle (null without --mtp-draft).
  nlohmann::json out = {
      {"schema", "puredrive-bench/3"},
      {"date_utc", utc_now()},
      {"commit", a.commit},
      {"note", a.note},
      {"device", device},
      {"model",
       {{"synth", a.synth},
        {"quant", a.quant},
        {"seed", a.seed},
        {"weight_bytes", sm->weight_bytes},
        {"bound_bytes", be.bound_bytes()},
        {"build_seconds", build_s}}},
      {"protocol",
       {{"mode", "greedy, non-speculative"},
        {"decode_tokens", a.tokens},
        {"runs_per_cell", a.runs},
        {"prefill", "real prefill of seeded random token ids (random weights have no tokenizer)"},
        {"fill", a.fill == "auto"
                     ? fmt::format("auto: real up to {} tokens, synthetic above", kAutoSyntheticFrom)
                     : a.fill},
        {"prefill_chunk_rows", a.prefill_chunk},
        {"kv_dtype", "bf16"},
        {"mtp_cycles",
         a.mtp_draft > 0 ? nlohmann::json(fmt::format("K = {}, acceptance: scripted ({})", a.mtp_draft,
                                                      check(make_accept_pattern(a, a.mtp_draft)).describe()))
                         : nlohmann::json(nullptr)},
        {"floor",
         "bytes per decode step (active weights + KV at the context + GDN state read and written) / "
         "measured device-to-device copy bandwidth (read + write)"}}},
      {"copy_bandwidth_bytes_per_second", bandwidth},
      {"step_bytes",
       {{"dense", sm->step_bytes.dense},
        {"experts_active", sm->step_bytes.experts_active},
        {"kv_per_token", sm->step_bytes.kv_per_token},
        {"gdn_state", sm->step_bytes.gdn_state}}},
      {"cells", nlohmann::json::array()},
      {"complete", false}};
  // The record is rewritten after every cell, so a run cut short still leaves its finished cells.
  auto write = [&] { write_record(a.json_out, out); };
  out["row_exact_check"] = row_exact_check(a, *model, *sm);
  // After 8190 tokens the verify rows straddle the doubling of the attention split size of the 35B shape
  // (64 -> 128 keys at 8192 keys, backend/cuda/attention_plan.h).
  if (a.fill != "real") out["row_exact_check_long"] = row_exact_check(a, *model, *sm, 8190);
  write();
  for (int c : contexts) {
    for (int run = 0; run < a.runs; ++run) {
      nlohmann::json cell = run_context(a, *model, *sm, c, bandwidth);
      cell["run"] = run;
      out["cells"].push_back(cell);
      write();
      fmt::print(stderr, "context {}: {:.1f} tok/s (floor {:.1f})\n", c,
                 cell["decode_tokens_per_second"].get<double>(),
                 cell["floor_tokens_per_second"].get<double>());
    }
  }
  out["complete"] = true;
  write();
  write_synth_markdown(a.markdown_out, out);
  const nlohmann::json& cells = out["cells"];
  fmt::print("synthetic {} {} on {}, copy bandwidth {:.0f} GB/s\n", a.synth, a.quant, be.name(),
             bandwidth / 1e9);
  fmt::print("{:>8} {:>12} {:>11} {:>11} {:>8} {:>14} {:>16} {:>12} {:>10} {:>9}\n", "context", "prefill t/s",
             "decode t/s", "floor t/s", "%floor", "step ms med",
             "verify R=" + std::to_string(a.verify_rows) + "/R=1", "bytes ratio", "attn ms", "attn GB/s");
  for (const nlohmann::json& c : cells) {
    const nlohmann::json& v = c["verify"];
    const nlohmann::json& at = c["decode_attention"];
    fmt::print("{:>8} {:>12} {:>11.1f} {:>11.1f} {:>7.1f}% {:>14.3f} {:>16.2f} {:>12} {:>10} {:>9}\n",
               c["context"].get<int>(),
               c["prefill_tokens_per_second"].is_null()
                   ? std::string("synthetic")
                   : fmt::format("{:.1f}", c["prefill_tokens_per_second"].get<double>()),
               c["decode_tokens_per_second"].get<double>(), c["floor_tokens_per_second"].get<double>(),
               100.0 * c["fraction_of_floor"].get<double>(), c["step_ms_median"].get<double>(),
               v["ratio"].get<double>(),
               v.contains("floor_ratio") ? fmt::format("{:.2f}", v["floor_ratio"].get<double>()) : "-",
               at.contains("ms_per_step") ? fmt::format("{:.3f}", at["ms_per_step"].get<double>()) : "-",
               at.contains("bandwidth_bytes_per_second")
                   ? fmt::format("{:.0f}", at["bandwidth_bytes_per_second"].get<double>() / 1e9)
                   : "-");
  }
  print_mtp_table(out);
}

void setup_bench(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  auto* cmd = app.add_subcommand(
      "bench", "Decode benchmark (docs/DESIGN.md §7) on a synthetic model or a checkpoint on disk");
  cmd->add_option("--synth", args->synth, "Synthetic architecture")->check(CLI::IsMember(synth_archs()));
  cmd->add_option("--model", args->model, "Model directory: the protocol on a real checkpoint");
  cmd->add_option("--quant", args->quant, "Weight format of the synthetic model")
      ->check(CLI::IsMember(synth_quants()));
  cmd->add_option("--seed", args->seed, "Random seed of weights and prompts (--synth)");
  auto* contexts = cmd->add_option("--contexts", args->contexts, "Context sizes, e.g. 2k,32k (--model: 2k)");
  auto* tokens =
      cmd->add_option("-n,--tokens", args->tokens, "Decode tokens per cell (--synth 128, --model 512)")
          ->check(CLI::Range(1, 1 << 20));
  auto* runs = cmd->add_option("--runs", args->runs, "Runs per cell (--synth 1; --model 3, one prompt each)")
                   ->check(CLI::Range(1, 100));
  cmd->add_option("--verify-rows", args->verify_rows, "Rows of the timed verify step (--synth)")
      ->check(CLI::Range(2, 8));
  cmd->add_option("--verify-iters", args->verify_iters, "Timed verify steps per width (--synth)")
      ->check(CLI::Range(1, 10000));
  auto* chunk = cmd->add_option("--prefill-chunk", args->prefill_chunk,
                                "Rows per prefill step (0: as a session chooses, for the largest cell)")
                    ->check(CLI::Range(0, 16384))
                    ->capture_default_str();
  cmd->add_option("--prefill-runs", args->prefill_runs,
                  "Prefills of each cell's prompt (--synth, --fill real); the median is reported")
      ->check(CLI::Range(1, 20));
  cmd->add_option("--profile-steps", args->profile_steps,
                  "Eager one-row steps timed op by op (CUDA, --synth)")
      ->check(CLI::Range(0, 64));
  cmd->add_option("--profile-rows", args->profile_rows,
                  "Rows of the last profiled step, the one marked for ncu (CUDA, --synth)")
      ->check(CLI::Range(1, 8));
  cmd->add_option("--fill", args->fill,
                  "How a cell's context is filled: real (prefill), synthetic (random KV and GDN state), auto "
                  "(synthetic above 64K tokens)")
      ->check(CLI::IsMember({"real", "synthetic", "auto"}));
  cmd->add_option("--copy-mib", args->copy_mib, "Buffer size of the bandwidth measurement")
      ->check(CLI::Range(1, 1 << 16));
  auto* backend = cmd->add_option("--backend", args->backend, "cuda or cpu (--model: also auto, the default)")
                      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--threads", args->threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 1024));
  cmd->add_option("--json", args->json_out, "Write the full record as JSON to this file");
  cmd->add_option("--markdown", args->markdown_out, "--synth: write a short Markdown summary to this file");
  cmd->add_option("--commit", args->commit, "Commit hash recorded in the JSON");
  cmd->add_option("--note", args->note, "Free text recorded in the JSON (e.g. uncommitted changes)");
  cmd->add_option("--modes", args->modes,
                  "--model: greedy, greedy-mtp, sample (generation_config's sampling), sample-mtp")
      ->capture_default_str();
  auto* mtp =
      cmd->add_option("--mtp-draft", args->mtp_draft,
                      "Draft length k: --model, of the MTP modes (default 2); --synth, time MTP cycles "
                      "with a scripted acceptance in every cell (1..7)")
          ->check(CLI::Range(1, 8));
  cmd->add_option("--accept-pattern", args->accept_pattern,
                  "--synth --mtp-draft: accepted drafts per cycle, cycled, e.g. 2,1,2");
  cmd->add_option(
         "--accept-mean", args->accept_mean,
         "--synth --mtp-draft: tokens per cycle of a deterministic pattern (default 2.3, at most k + 1)")
      ->check(CLI::Range(1.0, 16.0));
  cmd->add_option(
         "--mtp-rule", args->mtp_rule,
         "--synth --mtp-draft: the sampling of the plain steps and cycles: greedy, or seeded (temperature "
         "0.8, top-p 0.95, a seed: the exact sampling of a chat request, whose sample op the cycles run "
         "three times)")
      ->check(CLI::IsMember({"greedy", "seeded"}))
      ->capture_default_str();
  add_draft_options(cmd, &args->mtp_draft_vocab, &args->mtp_window);
  add_adaptive_option(cmd, &args->mtp_adaptive);
  cmd->add_option("--ctx-size", args->ctx_size,
                  "--model: the session's context (0: the model's, or the largest that fits)");
  cmd->add_option("--prompt-root", args->prompt_root,
                  "--model: the repository whose source text makes the prompts")
      ->capture_default_str();
  cmd->add_option("--prompt-text", args->prompt_text,
                  "--model: print prompt N (0..2) of the first context as text and exit (bench/api_bench.py "
                  "sends it through the API)")
      ->check(CLI::Range(0, 2));
  cmd->add_flag("--read-weights", args->read_weights,
                "--model: only read the weights through the GPU upload's reader, twice, and report GB/s and "
                "peak memory");
  cmd->callback([args, contexts, tokens, runs, chunk, backend, mtp] {
    BenchArgs a = *args;
    if (!a.model.empty()) {
      if (contexts->count() == 0) a.contexts = "2k";
      if (tokens->count() == 0) a.tokens = 512;
      if (runs->count() == 0) a.runs = 3;
      if (backend->count() == 0) a.backend = "auto";
    } else if (a.backend == "auto") {
      fail(make_error(ErrorCode::kInvalidArgument, "bench --synth takes --backend cuda or cpu"));
    } else if (mtp->count() == 0) {
      a.mtp_draft = 0;
    }
    run_bench(a);
  });
}

const bool registered = register_command(setup_bench);

}  // namespace
}  // namespace pd::cli
