#include "puredrive/decode/exactness_gates.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>

#include "puredrive/decode/scripted_drafter.h"

namespace pd::gates {
namespace {

std::vector<int32_t> iota_from(int first, int n) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), first);
  return p;
}

std::vector<float> download(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.rows * t.cols));
  if (!be.download(v.data(), t).is_ok()) v.clear();
  return v;
}

bool same_bits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// Runs `context` from an empty state as the generator does: its first prefill_rows tokens as prefill steps of
// at most max_rows rows, then one row at a time (bitwise the rows of a verify step); returns the last row's
// logits.
Expected<std::vector<float>> last_logits(Model& model, SequenceState& st, std::span<const int32_t> context,
                                         int prefill_rows) {
  PD_TRY(st.reset());
  const auto count = static_cast<int>(context.size());
  std::vector<float> logits;
  for (int begin = 0; begin < count;) {
    const bool prefill = begin < prefill_rows;
    const int rows = prefill ? std::min(model.max_rows(), prefill_rows - begin) : 1;
    const bool last = begin + rows == count;
    PD_ASSIGN_OR_RETURN(
        StepOutput out,
        model.forward(st, context.subspan(static_cast<size_t>(begin), rows), iota_from(begin, rows),
                      {.logits = last ? LogitRows::kLast : LogitRows::kNone, .tap = {}, .prefill = prefill}));
    if (last) logits = download(model.backend(), out.logits);
    begin += rows;
  }
  return logits;
}

}  // namespace

const char* draft_source_name(DraftSource s) {
  switch (s) {
    case DraftSource::kMtp:
      return "mtp";
    case DraftSource::kOracle:
      return "oracle";
    case DraftSource::kRandomPrefix:
      return "random-prefix";
  }
  return "?";
}

std::vector<int32_t> random_prompt(int32_t limit, int length, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> p(static_cast<size_t>(length));
  for (int32_t& t : p) t = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(limit));
  return p;
}

bool IdentityReport::all_accepted() const {
  return stats.cycles > 0 && stats.accepted == stats.drafted;
}

bool IdentityReport::all_lengths(int k) const {
  if (static_cast<int>(stats.length_hist.size()) < k + 1) return false;
  for (int a = 0; a <= k; ++a) {
    if (stats.length_hist[static_cast<size_t>(a)] == 0) return false;
  }
  return true;
}

std::string IdentityReport::summary() const {
  std::string s =
      identical()
          ? fmt::format("{} tokens identical", plain.size())
          : fmt::format("DIFFER at token {} of {} (plain {} vs speculative {})", first_mismatch, plain.size(),
                        first_mismatch >= 0 ? plain[static_cast<size_t>(first_mismatch)] : -1,
                        first_mismatch >= 0 && first_mismatch < static_cast<int>(speculative.size())
                            ? speculative[static_cast<size_t>(first_mismatch)]
                            : -1);
  s += fmt::format(", {} cycles, {:.2f} tokens/cycle, accepted lengths", stats.cycles,
                   stats.tokens_per_cycle());
  for (int64_t c : stats.length_hist) s += fmt::format(" {}", c);
  return s;
}

Expected<IdentityReport> check_identity(Generator& g, const IdentityCase& c,
                                        const std::vector<int32_t>* plain) {
  IdentityReport rep;
  DecodeRequest req;
  req.prompt = c.prompt;
  req.sampling = c.sampling;
  if (plain != nullptr) {
    rep.plain.assign(plain->begin(), plain->begin() + std::min<size_t>(plain->size(), c.num_tokens));
  } else {
    // The scripted drafters look up to k tokens past the end.
    req.max_tokens = c.num_tokens + c.num_draft;
    req.num_draft = 0;
    PD_ASSIGN_OR_RETURN(DecodeResult p, g.generate(req));
    rep.plain = p.tokens;
  }
  std::unique_ptr<ScriptedDrafter> scripted;
  if (c.source != DraftSource::kMtp) {
    const std::vector<int32_t>& future = plain != nullptr ? *plain : rep.plain;
    scripted = std::make_unique<ScriptedDrafter>(future,
                                                 c.source == DraftSource::kOracle
                                                     ? ScriptedDrafter::Mode::kOracle
                                                     : ScriptedDrafter::Mode::kRandomPrefix,
                                                 g.vocab_size(), c.drafter_seed);
  }
  rep.plain.resize(std::min<size_t>(rep.plain.size(), c.num_tokens));
  req.max_tokens = c.num_tokens;
  req.num_draft = c.num_draft;
  req.drafter = scripted.get();
  req.draft_temperature = c.draft_temperature;
  PD_ASSIGN_OR_RETURN(DecodeResult s, g.generate(req));
  rep.speculative = s.tokens;
  rep.stats = s.accept;
  rep.cycle_accepted = s.cycle_accepted;
  const size_t n = std::min(rep.plain.size(), rep.speculative.size());
  for (size_t i = 0; i < n; ++i) {
    if (rep.plain[i] != rep.speculative[i]) {
      rep.first_mismatch = static_cast<int>(i);
      break;
    }
  }
  if (rep.first_mismatch < 0 && rep.plain.size() != rep.speculative.size())
    rep.first_mismatch = static_cast<int>(n);
  return rep;
}

Expected<RowExactReport> check_row_exactness(Model& model, int max_r, uint64_t seed) {
  RowExactReport rep;
  const int V = model.config().vocab_size;
  const int H = model.config().hidden_size;
  max_r = std::min(max_r, model.max_rows());
  constexpr int kPrefix = 3, kAfter = 3;
  const std::vector<int32_t> tokens = random_prompt(V, kPrefix + max_r + kAfter, seed);
  auto problem = [&](std::string what) {
    if (rep.mismatches++ == 0) rep.first_problem = std::move(what);
  };
  // One-row reference: logits and hidden after every token.
  PD_ASSIGN_OR_RETURN(
      SequenceState st,
      model.new_state({.ctx_size = 64, .kv_dtype = DType::kBF16, .max_rows = std::max(2, max_r)}));
  std::vector<std::vector<float>> ref_logits, ref_hidden;
  for (size_t i = 0; i < tokens.size(); ++i) {
    PD_ASSIGN_OR_RETURN(
        StepOutput o, model.forward(st, std::span(tokens).subspan(i, 1), iota_from(static_cast<int>(i), 1)));
    ref_logits.push_back(download(model.backend(), o.logits));
    ref_hidden.push_back(download(model.backend(), o.hidden));
  }
  for (int R = 2; R <= max_r; ++R) {
    ++rep.rows_checked;
    for (int j : {0, R / 2, R - 1}) {
      PD_TRY(st.reset());
      PD_ASSIGN_OR_RETURN(StepOutput pre,
                          model.forward(st, std::span(tokens).first(kPrefix), iota_from(0, kPrefix)));
      (void)pre;
      PD_ASSIGN_OR_RETURN(StepOutput o,
                          model.forward(st, std::span(tokens).subspan(kPrefix, static_cast<size_t>(R)),
                                        iota_from(kPrefix, R)));
      const std::vector<float> logits = download(model.backend(), o.logits);
      const std::vector<float> hidden = download(model.backend(), o.hidden);
      for (int r = 0; r < R && j == 0; ++r) {
        const size_t t = static_cast<size_t>(kPrefix + r);
        if (!same_bits(ref_logits[t].data(), logits.data() + static_cast<size_t>(r) * V,
                       static_cast<size_t>(V))) {
          problem(fmt::format("R={}: logits of row {} differ from the one-row step", R, r));
        }
        if (!same_bits(ref_hidden[t].data(), hidden.data() + static_cast<size_t>(r) * H,
                       static_cast<size_t>(H))) {
          problem(fmt::format("R={}: hidden state of row {} differs from the one-row step", R, r));
        }
      }
      // Roll back to row j and continue one row at a time.
      PD_TRY(st.rewind(kPrefix + j + 1));
      for (int t = kPrefix + j + 1; t < kPrefix + j + 1 + kAfter; ++t) {
        PD_ASSIGN_OR_RETURN(
            StepOutput c,
            model.forward(st, std::span(tokens).subspan(static_cast<size_t>(t), 1), iota_from(t, 1)));
        const std::vector<float> l = download(model.backend(), c.logits);
        if (!same_bits(ref_logits[static_cast<size_t>(t)].data(), l.data(), static_cast<size_t>(V))) {
          problem(fmt::format("R={}: after rewinding to row {}, the logits of token {} differ", R, j, t));
        }
      }
    }
  }
  return rep;
}

Expected<TwoTokenLaw> exact_next_two(Model& model, const std::vector<int32_t>& prompt,
                                     const SamplingParams& params) {
  PD_ASSIGN_OR_RETURN(SequenceState st, model.new_state({.ctx_size = static_cast<int>(prompt.size()) + 4,
                                                         .kv_dtype = DType::kBF16,
                                                         .max_rows = 2}));
  const int32_t V = model.config().vocab_size;
  // p(. | context) as plain decoding samples it: the penalties see the prompt and the generated tokens.
  auto dist = [&](std::span<const int32_t> context, TokenDistribution* out) -> Status {
    PD_ASSIGN_OR_RETURN(std::vector<float> logits,
                        last_logits(model, st, context, static_cast<int>(prompt.size()) - 1));
    TokenHistory history(V);
    history.add_prompt(context.first(prompt.size()));
    for (size_t i = prompt.size(); i < context.size(); ++i) history.push(context[i]);
    return process_logits(logits, params, &history, out);
  };
  TwoTokenLaw law;
  law.vocab = V;
  TokenDistribution first, second;
  PD_TRY(dist(prompt, &first));
  std::vector<int32_t> context = prompt;
  context.push_back(0);
  for (int32_t t1 : first.kept) {
    context.back() = t1;
    PD_TRY(dist(context, &second));
    for (int32_t t2 : second.kept) {
      law.keys.push_back(int64_t{t1} * V + t2);
      law.probs.push_back(first.prob(t1) * second.prob(t2));
    }
  }
  return law;
}

Expected<FitReport> speculative_two_token_fit(Generator& g, const FitCase& c, const Verifier& verifier,
                                              const TwoTokenLaw& law) {
  const auto t0 = std::chrono::steady_clock::now();
  const int32_t V = g.vocab_size();
  if (law.vocab != V || law.keys.empty()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "two-token law of vocabulary {} with {} pairs, model vocabulary {}", law.vocab,
                      law.keys.size(), V);
  }
  FitReport rep;
  // Cells: the law's pairs, then one cell of probability 0 for anything else.
  std::vector<int64_t> counts(law.keys.size() + 1, 0);
  std::vector<double> probs = law.probs;
  probs.push_back(0.0);
  DecodeRequest req;
  req.prompt = c.prompt;
  req.sampling = c.sampling;
  req.sampling.seed.reset();
  // k + 1 tokens allowed, so the first cycle drafts k; the sink stops the run once two tokens are out.
  req.max_tokens = c.num_draft + 1;
  req.num_draft = c.num_draft;
  req.verifier = verifier;
  req.draft_temperature = c.draft_temperature;
  for (int i = 0; i < c.samples; ++i) {
    req.rng_seed = (c.seed << 32) + static_cast<uint64_t>(i);
    size_t emitted = 0;
    const ChunkSink two = [&emitted](const DecodeChunk& chunk) {
      return (emitted += chunk.tokens.size()) < 2;
    };
    PD_ASSIGN_OR_RETURN(DecodeResult r, g.generate(req, two));
    r.tokens.resize(std::min<size_t>(r.tokens.size(), 2));
    if (r.tokens.size() != 2 || r.cycle_accepted.empty()) {
      return make_error(ErrorCode::kInternal, "sample {}: {} tokens in {} cycles, expected 2 tokens", i,
                        r.tokens.size(), r.cycle_accepted.size());
    }
    const int64_t key = int64_t{r.tokens[0]} * V + r.tokens[1];
    const auto it = std::lower_bound(law.keys.begin(), law.keys.end(), key);
    ++counts[it != law.keys.end() && *it == key ? static_cast<size_t>(it - law.keys.begin())
                                                : law.keys.size()];
    rep.first_cycle.record(c.num_draft, r.cycle_accepted[0]);
  }
  rep.chi = chi_square_goodness_of_fit(counts, probs);
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace pd::gates
