#include "cli/bench_mtp.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "puredrive/decode/cycle_runner.h"
#include "puredrive/decode/mtp_drafter.h"
#include "puredrive/model/synthetic_fill.h"
#ifdef PD_HAVE_CUDA
#include "puredrive/backend/cuda/cuda_backend.h"
#endif

namespace pd::cli {
namespace {

template <typename T>
T check(Expected<T> e) {
  return bench_check(std::move(e));
}
void check(const Status& s) {
  bench_check(s);
}

constexpr uint64_t kSeededRuleSeed = 7;  // --mtp-rule seeded

// The MTP head's real draft work, then its drafts replaced by the scripted ones: the plain run's tokens
// (`future`, from the same state) for the first a positions of the cycle, a different token at position a
// + 1.
class PatternDrafter final : public Drafter {
 public:
  PatternDrafter(Drafter& head, std::span<const int32_t> future, const AcceptPattern& pattern, int32_t vocab)
      : head_(head), future_(future), pattern_(pattern), vocab_(vocab) {}

  void reset() override {
    head_.reset();
    cycle_ = 0;
  }
  Status observe(SequenceState& state, int first, std::span<const int32_t> next_tokens,
                 const Tensor& hidden) override {
    return head_.observe(state, first, next_tokens, hidden);
  }
  bool can_draft(int64_t position) const override { return head_.can_draft(position); }
  Status draft(SequenceState& state, const DraftContext& ctx, DraftBlock* out) override {
    PD_TRY(head_.draft(state, ctx, out));
    const int k = ctx.num_draft;
    const auto done = static_cast<size_t>(static_cast<int64_t>(ctx.sequence.size()) - ctx.prompt_length);
    if (done + static_cast<size_t>(k) > future_.size()) {
      return make_error(ErrorCode::kInternal, "scripted drafts past the {} tokens of the plain run",
                        future_.size());
    }
    const int right = std::min(pattern_.at(cycle_++), k);
    out->tokens.resize(static_cast<size_t>(k));
    out->on_device = false;
    for (int j = 0; j < k; ++j) {
      const int32_t want = future_[done + static_cast<size_t>(j)];
      out->tokens[static_cast<size_t>(j)] = j < right ? want : (want + 1) % vocab_;
    }
    return Status::ok();
  }
  int expected(int64_t cycle, int k) const { return std::min(pattern_.at(cycle), k); }

 private:
  Drafter& head_;
  std::span<const int32_t> future_;
  const AcceptPattern& pattern_;
  int32_t vocab_;
  int64_t cycle_ = 0;
};

// dst := the committed part of src (same model): KV rows, GDN states, the head's KV rows, the lengths.
Status copy_state(Backend& be, const SequenceState& src, SequenceState& dst) {
  PD_TRY(dst.reset());
  const CacheSpec& spec = src.spec();
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    const int li = static_cast<int>(l);
    if (spec.layers[l] == LayerType::kFullAttention) {
      const KvCache s = src.kv(li), d = dst.kv(li);
      PD_TRY(be.copy(d.k.row_slice(0, src.length()), s.k.row_slice(0, src.length())));
      PD_TRY(be.copy(d.v.row_slice(0, src.length()), s.v.row_slice(0, src.length())));
    } else {
      const GdnState s = src.gdn(li), d = dst.gdn(li);
      PD_TRY(be.copy(d.conv, s.conv));
      PD_TRY(be.copy(d.recurrent, s.recurrent));
    }
  }
  for (int i = 0; i < spec.mtp_layers; ++i) {
    const KvCache s = src.mtp_kv(i), d = dst.mtp_kv(i);
    PD_TRY(be.copy(d.k.row_slice(0, src.mtp_length()), s.k.row_slice(0, src.mtp_length())));
    PD_TRY(be.copy(d.v.row_slice(0, src.mtp_length()), s.v.row_slice(0, src.mtp_length())));
  }
  dst.commit_step(src.length(), false);
  dst.commit_mtp(0, src.mtp_length());
  return be.synchronize();
}

struct DeviceCounters {
  int64_t experts = 0;
#ifdef PD_HAVE_CUDA
  std::optional<CudaStepStats> steps;
#endif
};

DeviceCounters counters(Backend& be) {
  DeviceCounters c;
#ifdef PD_HAVE_CUDA
  if (be.device() == Device::kCuda) {
    c.experts = check(cuda_moe_experts_read(be));
    c.steps = cuda_step_stats(be);
  }
#else
  (void)be;
#endif
  return c;
}

// Wall times of a loop's iterations after `warmup` of them (graph captures happen there).
struct LoopTimes {
  std::vector<double> each;
  Clock::time_point last = Clock::now();
  void mark() {
    const auto now = Clock::now();
    each.push_back(seconds(last, now));
    last = now;
  }
  double total(size_t warmup) const {
    double t = 0;
    for (size_t i = warmup; i < each.size(); ++i) t += each[i];
    return t;
  }
  double median_after(size_t warmup) const {
    return median(std::vector<double>(
        each.begin() + static_cast<std::ptrdiff_t>(std::min(warmup, each.size())), each.end()));
  }
};

}  // namespace

int AcceptPattern::at(int64_t cycle) const {
  if (!list.empty()) return list[static_cast<size_t>(cycle % static_cast<int64_t>(list.size()))];
  const double mu = mean_tokens - 1.0;
  auto cum = [&](int64_t i) { return static_cast<int64_t>(std::floor(static_cast<double>(i) * mu + 1e-9)); };
  return static_cast<int>(cum(cycle + 1) - cum(cycle));
}

std::string AcceptPattern::describe() const {
  if (!list.empty()) return fmt::format("accepted drafts per cycle {}, cycled", fmt::join(list, ","));
  return fmt::format("mean {:.2f} tokens per cycle (accepted drafts floor((i+1)(m-1)) - floor(i(m-1)))",
                     mean_tokens);
}

Expected<AcceptPattern> make_accept_pattern(const BenchArgs& a, int k) {
  AcceptPattern p;
  if (!a.accept_pattern.empty() && a.accept_mean > 0) {
    return make_error(ErrorCode::kInvalidArgument, "give --accept-pattern or --accept-mean, not both");
  }
  if (!a.accept_pattern.empty()) {
    size_t i = 0;
    while (i <= a.accept_pattern.size()) {
      size_t j = a.accept_pattern.find(',', i);
      if (j == std::string::npos) j = a.accept_pattern.size();
      const std::string item = a.accept_pattern.substr(i, j - i);
      int v = -1;
      try {
        size_t used = 0;
        v = std::stoi(item, &used);
        if (used != item.size()) v = -1;
      } catch (const std::exception&) {
        v = -1;
      }
      if (v < 0 || v > k) {
        return make_error(
            ErrorCode::kInvalidArgument,
            "--accept-pattern: '{}' is not a number of accepted drafts in 0..{} (--mtp-draft {})", item, k,
            k);
      }
      p.list.push_back(v);
      i = j + 1;
    }
    return p;
  }
  p.mean_tokens = a.accept_mean > 0 ? a.accept_mean : std::min(2.3, k + 1.0);
  if (!(p.mean_tokens >= 1.0 && p.mean_tokens <= k + 1.0)) {
    return make_error(ErrorCode::kInvalidArgument,
                      "--accept-mean {}: tokens per cycle must be in 1..{} for --mtp-draft {}", p.mean_tokens,
                      k + 1, k);
  }
  return p;
}

nlohmann::json run_mtp_cell(const BenchArgs& a, Model& m, const SynthModel& sm, const SequenceState& filled,
                            int32_t x_n, double bandwidth) {
  Backend& be = m.backend();
  const int k = a.mtp_draft;
  const int context = filled.length();
  const int V = sm.config.vocab_size;
  const AcceptPattern pattern = check(make_accept_pattern(a, k));
  if (a.tokens < 4 * (k + 4)) {
    bench_fail(make_error(ErrorCode::kInvalidArgument,
                          "--mtp-draft {} needs --tokens >= {} (warm-up and timed cycles)", k, 4 * (k + 4)));
  }
  const StateOptions opts{
      .ctx_size = context + a.tokens + k + 16, .kv_dtype = filled.kv_dtype(), .max_rows = std::max(8, k + 1)};
  SequenceState base = check(m.new_state(opts)), work = check(m.new_state(opts));
  check(copy_state(be, filled, base));
  // The head's rows for positions [0, context - 1) (x_{i+1} with the target's hidden at i); the row at
  // context - 1 (x_n with the hidden before it) is observed below with a synthetic hidden state.
  const uint64_t seed = sm.seed + static_cast<uint64_t>(context) + 11;
  check(fill_synthetic_mtp(be, base, context - 1, seed));
  const int H = sm.config.hidden_size;
  Buffer hidden = check(be.alloc(DType::kF32, 1, H));
  {
    std::vector<float> h(static_cast<size_t>(H));
    for (int i = 0; i < H; ++i)
      h[static_cast<size_t>(i)] = synthetic_value(seed, static_cast<uint64_t>(i), 1.0f);
    check(be.upload(hidden.tensor(), h.data()));
  }
  std::unique_ptr<DeviceSampler> sampler = check(DeviceSampler::create(be, V));
  std::unique_ptr<MtpDrafter> head = check(MtpDrafter::create(m));
  // Greedy, or seeded sampling: the scripted drafts copy the plain run's draws, which the seeded rule
  // accepts as it accepts any draft equal to the target's draw at its position.
  const bool seeded = a.mtp_rule == "seeded";
  SamplingParams params;
  params.temperature = seeded ? 0.8f : 0.0f;
  if (seeded) {
    params.top_p = 0.95f;
    params.seed = kSeededRuleSeed;
  }
  const CycleSettings settings{.verifier = Verifier(seeded ? AcceptRule::kSeeded : AcceptRule::kGreedy),
                               .seed = params.seed.value_or(0),
                               .top_logprobs = -1,
                               .timing = false};
  Rng rng(seed);
  // Positions [0, context) are in the state; only the sequence's length and last token matter here.
  std::vector<int32_t> seq(static_cast<size_t>(context), 0);
  seq.push_back(x_n);
  const int prompt_length = context + 1;
  auto restart = [&] {
    check(copy_state(be, base, work));
    check(head->resume(context - 1));
    check(head->observe(work, context - 1, std::span(&x_n, 1), hidden.tensor()));
    check(sampler->begin(params, params, {}));
    seq.resize(static_cast<size_t>(prompt_length));
  };

  // Plain steps through the generator's path (forward, sample op, one download); their tokens are the
  // future the scripted drafts copy.
  // Counters and clocks are read between a step's download and the next step's recording (a read inside a
  // recorded step would run it eagerly); each timed interval is one commit and the next step.
  constexpr int kPlainWarmup = 3;
  restart();
  LoopTimes plain;
  DeviceCounters p0;
  {
    CycleRunner r(m, work, *sampler, nullptr, rng, rng, settings);
    for (int i = 0; i < a.tokens; ++i) {
      const Verdict* v = check(r.plain_step(seq));
      if (i >= kPlainWarmup) plain.mark();
      if (i + 1 == kPlainWarmup) {
        p0 = counters(be);
        plain.last = Clock::now();
      }
      seq.push_back(v->tokens.at(0));
      check(r.commit(1, false));
    }
    check(r.finish());
  }
  [[maybe_unused]] const DeviceCounters p1 = counters(be);  // read only with CUDA
  const std::vector<int32_t> future(seq.begin() + prompt_length, seq.end());
  const double plain_s = plain.total(0) / static_cast<double>(a.tokens - kPlainWarmup);

  // Cycles: untimed warm-up cycles capture the graphs of every accepted length.
  const int warmup = k + 3;
  struct Pass {
    int64_t cycles = 0, timed_cycles = 0, timed_tokens = 0;
    bool as_scripted = true, equals_plain = true;
    std::vector<int64_t> hist;
    LoopTimes times;
    CycleTimes split0, split1;
    DeviceCounters c0, c1;
  };
  auto run_cycles = [&](bool timing) {
    Pass p;
    p.hist.assign(static_cast<size_t>(k + 1), 0);
    restart();
    PatternDrafter drafter(*head, future, pattern, V);
    CycleSettings cs = settings;
    cs.timing = timing;
    CycleRunner r(m, work, *sampler, &drafter, rng, rng, cs);
    while (static_cast<int64_t>(seq.size()) - prompt_length + k + 1 <= static_cast<int64_t>(future.size())) {
      const size_t done = seq.size() - static_cast<size_t>(prompt_length);
      const Verdict* v = check(r.cycle(seq, prompt_length, k));
      const int acc = v->accepted;
      if (p.cycles >= warmup) {
        p.times.mark();
        ++p.timed_cycles;
        p.timed_tokens += acc + 1;
        ++p.hist[static_cast<size_t>(acc)];
      }
      if (p.cycles + 1 == warmup) {
        p.c0 = counters(be);
        p.split0 = r.times();
        p.times.last = Clock::now();
      }
      p.as_scripted = p.as_scripted && acc == drafter.expected(p.cycles, k);
      for (size_t j = 0; j < v->tokens.size(); ++j) {
        p.equals_plain = p.equals_plain && done + j < future.size() && v->tokens[j] == future[done + j];
      }
      seq.insert(seq.end(), v->tokens.begin(), v->tokens.end());
      check(r.commit(static_cast<int>(v->tokens.size()), true));
      ++p.cycles;
    }
    check(r.finish());
    p.c1 = counters(be);
    p.split1 = r.times();
    return p;
  };
  const Pass main = run_cycles(false);
  const Pass split = run_cycles(true);
  if (main.timed_cycles == 0 || split.timed_cycles == 0) {
    bench_fail(make_error(ErrorCode::kInvalidArgument,
                          "--tokens {} leave no timed MTP cycle after {} warm-up cycles; give more", a.tokens,
                          warmup));
  }

  const double cycle_s = main.times.total(0) / static_cast<double>(main.timed_cycles);
  const double tokens_per_cycle =
      static_cast<double>(main.timed_tokens) / static_cast<double>(main.timed_cycles);
  const double tps = tokens_per_cycle / cycle_s;
  const double plain_tps = 1.0 / plain_s;

  // The floor: K draft steps and one verify step of K + 1 rows (which also writes K + 1 GDN snapshots), with
  // the experts the cycles read when the device counts them, else top_k per layer and step.
  const StepBytes& sb = sm.step_bytes;
  const int64_t draft_vocab = a.mtp_draft_vocab > 0 ? a.mtp_draft_vocab : V;
  const double expert_bytes =
      static_cast<double>(sb.experts_active) /
      static_cast<double>(sm.config.num_experts_per_tok * sm.config.num_hidden_layers);
  const double draft_dense =
      static_cast<double>(sb.mtp_at_context(context, draft_vocab, V) - sb.mtp_experts_active);
  const double verify_dense = static_cast<double>(sb.at_context(context) - sb.experts_active) +
                              (k + 1) * static_cast<double>(sb.gdn_state) / 2;
  const bool measured = be.device() == Device::kCuda;
  const double experts_per_cycle =
      measured
          ? static_cast<double>(main.c1.experts - main.c0.experts) / static_cast<double>(main.timed_cycles)
          : static_cast<double>(k * sb.mtp_experts_active + sb.experts_active) / expert_bytes;
  const double cycle_bytes = k * draft_dense + verify_dense + experts_per_cycle * expert_bytes;
  const double floor_cycle_s = cycle_bytes / bandwidth;
  const double floor_tps = tokens_per_cycle / floor_cycle_s;
  auto per_cycle_ms = [&](double CycleTimes::*f) {
    const double span = split.split1.*f - split.split0.*f;
    return split.timed_cycles > 0 ? 1e3 * span / static_cast<double>(split.timed_cycles) : 0.0;
  };

  nlohmann::json out = {
      {"draft_tokens", k},
      {"acceptance", "scripted"},
      {"accept_pattern", pattern.describe()},
      {"drafter",
       "MTP head: every draft step and draw runs; its drafts are then replaced by the plain run's tokens "
       "from "
       "the same state, right for the pattern's count and wrong after"},
      {"mtp_cache_fill", "synthetic (positions before the context's last)"},
      {"mtp_draft_vocab", draft_vocab},
      {"mtp_window", a.mtp_window},
      {"rule", seeded ? "seeded (temperature 0.8, top-p 0.95)" : "greedy"},
      {"warmup_cycles", warmup},
      {"cycles", main.timed_cycles},
      {"tokens", main.timed_tokens},
      {"tokens_per_cycle", tokens_per_cycle},
      {"accepted_histogram", main.hist},
      {"cycle_ms", 1e3 * cycle_s},
      {"cycle_ms_median", 1e3 * main.times.median_after(0)},
      {"effective_tokens_per_second", tps},
      {"plain_step_ms", 1e3 * plain_s},
      {"plain_step_ms_median", 1e3 * plain.median_after(0)},
      {"plain_tokens_per_second", plain_tps},
      {"cycle_over_plain_step", cycle_s / plain_s},
      {"speedup_over_plain", tps / plain_tps},
      {"floor",
       {{"bytes_per_cycle", cycle_bytes},
        {"draft_step_bytes_without_experts", draft_dense},
        {"verify_step_bytes_without_experts", verify_dense},
        {"experts_per_cycle", experts_per_cycle},
        {"experts",
         measured ? "measured (distinct experts the cycles' MoE kernels read)" : "top_k per layer and step"},
        {"cycle_ms", 1e3 * floor_cycle_s},
        {"tokens_per_second", floor_tps}}},
      {"fraction_of_floor", tps / floor_tps},
      {"split_ms_per_cycle",
       {{"how", "a second pass that waits for the device after the drafts and after the verify step"},
        {"draft", per_cycle_ms(&CycleTimes::draft_seconds)},
        {"verify", per_cycle_ms(&CycleTimes::verify_seconds)},
        {"sample", per_cycle_ms(&CycleTimes::sample_seconds)},
        {"cycle", split.timed_cycles > 0
                      ? 1e3 * split.times.total(0) / static_cast<double>(split.timed_cycles)
                      : 0.0}}},
      {"output_equals_plain", main.equals_plain && split.equals_plain},
      {"acceptance_as_scripted", main.as_scripted && split.as_scripted}};
#ifdef PD_HAVE_CUDA
  if (main.c0.steps && main.c1.steps && p0.steps && p1.steps) {
    const CudaStepStats& s0 = *main.c0.steps;
    const CudaStepStats& s1 = *main.c1.steps;
    const auto cycles = static_cast<double>(main.timed_cycles);
    out["cuda_graphs"] = {
        {"host_waits_per_cycle", static_cast<double>(s1.host_waits - s0.host_waits) / cycles},
        {"host_waits_per_plain_step",
         static_cast<double>(p1.steps->host_waits - p0.steps->host_waits) / (a.tokens - kPlainWarmup)},
        {"graph_replays_per_cycle", static_cast<double>(s1.graph_replays - s0.graph_replays) / cycles},
        {"graphs_captured_in_timed_cycles", s1.graphs_captured - s0.graphs_captured},
        {"eager_steps_in_timed_cycles", s1.eager_steps - s0.eager_steps},
        {"nodes_in_last_graph", s1.last_graph_nodes}};
  }
#endif
  return out;
}

namespace {

std::string opt_ms(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? fmt::format("{:.3f}", j[key].get<double>()) : "-";
}

// One row per cell with an MTP cycle: context, cycle, plain step, their ratio, tok/s both ways, speedup, the
// floor and its share, tokens per cycle, the draft / verify / sample split, host waits per cycle, checks.
std::vector<std::vector<std::string>> mtp_rows(const nlohmann::json& record) {
  std::vector<std::vector<std::string>> rows;
  for (const nlohmann::json& c : record["cells"]) {
    const nlohmann::json& m = c.value("mtp_cycle", nlohmann::json());
    if (!m.is_object()) continue;
    const nlohmann::json& sp = m["split_ms_per_cycle"];
    const nlohmann::json g = m.value("cuda_graphs", nlohmann::json::object());
    rows.push_back(
        {fmt::format("{}", c["context"].get<int>()), fmt::format("{}", m["draft_tokens"].get<int>()),
         fmt::format("{:.2f}", m["tokens_per_cycle"].get<double>()),
         fmt::format("{:.3f}", m["cycle_ms"].get<double>()),
         fmt::format("{:.3f}", m["plain_step_ms"].get<double>()),
         fmt::format("{:.2f}", m["cycle_over_plain_step"].get<double>()),
         fmt::format("{:.1f}", m["effective_tokens_per_second"].get<double>()),
         fmt::format("{:.1f}", m["plain_tokens_per_second"].get<double>()),
         fmt::format("{:.2f}x", m["speedup_over_plain"].get<double>()),
         fmt::format("{:.1f}", m["floor"]["tokens_per_second"].get<double>()),
         fmt::format("{:.1f}%", 100.0 * m["fraction_of_floor"].get<double>()),
         fmt::format("{} / {} / {}", opt_ms(sp, "draft"), opt_ms(sp, "verify"), opt_ms(sp, "sample")),
         g.contains("host_waits_per_cycle") ? fmt::format("{:.2f}", g["host_waits_per_cycle"].get<double>())
                                            : "-",
         m["output_equals_plain"].get<bool>() && m["acceptance_as_scripted"].get<bool>() ? "ok" : "FAIL"});
  }
  return rows;
}

const std::vector<std::string>& mtp_header() {
  static const std::vector<std::string> h = {
      "context",          "K",           "tok/cycle", "cycle ms",
      "plain step ms",    "cycle/plain", "MTP tok/s", "plain tok/s",
      "speedup",          "floor tok/s", "% floor",   "draft/verify/sample ms",
      "host waits/cycle", "identity"};
  return h;
}

}  // namespace

void print_mtp_table(const nlohmann::json& record) {
  const std::vector<std::vector<std::string>> rows = mtp_rows(record);
  if (rows.empty()) return;
  fmt::print("MTP cycles ({}):\n", record["protocol"].value("mtp_cycles", std::string()));
  fmt::print("{}\n", fmt::join(mtp_header(), " | "));
  for (const auto& r : rows) fmt::print("{}\n", fmt::join(r, " | "));
}

void write_synth_markdown(const std::string& path, const nlohmann::json& record) {
  if (path.empty()) return;
  const nlohmann::json& model = record["model"];
  std::string md = fmt::format("# bench --synth {} {} ({})\n\n", model["synth"].get<std::string>(),
                               model["quant"].get<std::string>(), record["date_utc"].get<std::string>());
  md += fmt::format("Commit {} ({}), {}; copy bandwidth {:.0f} GB/s. Record: the JSON beside this file.\n\n",
                    record["commit"].get<std::string>().empty() ? "?" : record["commit"].get<std::string>(),
                    record["note"].get<std::string>().empty() ? "no note" : record["note"].get<std::string>(),
                    record["device"]["backend"].get<std::string>(),
                    record["copy_bandwidth_bytes_per_second"].get<double>() / 1e9);
  md += "| context | fill | decode tok/s | floor tok/s | % of floor | step ms | verify R/R=1 |\n";
  md += "| --- | --- | --- | --- | --- | --- | --- |\n";
  for (const nlohmann::json& c : record["cells"]) {
    md +=
        fmt::format("| {} | {} | {:.1f} | {:.1f} | {:.1f}% | {:.3f} | {:.2f} |\n", c["context"].get<int>(),
                    c["fill"].get<std::string>(), c["decode_tokens_per_second"].get<double>(),
                    c["floor_tokens_per_second"].get<double>(), 100.0 * c["fraction_of_floor"].get<double>(),
                    c["step_ms_median"].get<double>(), c["verify"]["ratio"].get<double>());
  }
  const std::vector<std::vector<std::string>> rows = mtp_rows(record);
  if (!rows.empty()) {
    md += fmt::format(
        "\nMTP cycles, {}. Plain step: the same sample op and one download per step, in the same "
        "run. Floor: K draft steps and one verify step over the copy bandwidth.\n\n",
        record["protocol"].value("mtp_cycles", std::string()));
    md += fmt::format("| {} |\n", fmt::join(mtp_header(), " | "));
    md += "|";
    for (size_t i = 0; i < mtp_header().size(); ++i) md += " --- |";
    md += "\n";
    for (const auto& r : rows) md += fmt::format("| {} |\n", fmt::join(r, " | "));
  }
  std::ofstream f(path);
  f << md;
  if (!f) bench_fail(make_error(ErrorCode::kIo, "cannot write --markdown {}", path));
}

}  // namespace pd::cli
