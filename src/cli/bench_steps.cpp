#include "cli/bench_steps.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "puredrive/model/synthetic_fill.h"

namespace pd::cli {

std::vector<int32_t> run_step(Model& m, SequenceState& st, std::span<const int32_t> tokens, LogitRows rows,
                              const Buffer& ids, bool prefill) {
  Backend& be = m.backend();
  std::vector<int32_t> pos(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) pos[i] = st.length() + static_cast<int32_t>(i);
  bench_check(be.begin_step());
  Expected<StepOutput> o = m.forward(st, tokens, pos, {.logits = rows, .tap = {}, .prefill = prefill});
  if (o && !o->logits.empty()) {
    const Status s = be.argmax({.x = o->logits, .out = ids.row_slice(0, o->logits.rows)});
    if (!s) {
      (void)be.end_step();
      bench_fail(s);
    }
  }
  bench_check(be.end_step());
  if (!o) bench_fail(o.status());
  std::vector<int32_t> out;
  if (!o->logits.empty()) {
    out.resize(static_cast<size_t>(o->logits.rows));
    bench_check(be.download(out.data(), ids.row_slice(0, o->logits.rows)));
  }
  return out;
}

nlohmann::json row_exact_check(const BenchArgs& a, Model& m, const SynthModel& sm, int synthetic) {
  Backend& be = m.backend();
  const int V = sm.config.vocab_size;
  const int R = a.verify_rows;
  const int prompt_len = synthetic > 0 ? synthetic : 64;
  const StateOptions opts{
      .ctx_size = prompt_len + R + 8, .kv_dtype = DType::kBF16, .max_rows = std::max(8, R)};
  SequenceState wide = bench_check(m.new_state(opts)), narrow = bench_check(m.new_state(opts));
  Buffer ids = bench_check(be.alloc(DType::kI32, std::max(8, a.prefill_chunk), 1));
  const std::vector<int32_t> prompt = synth_tokens(sm.seed + 7, V, prompt_len);
  for (SequenceState* st : {&wide, &narrow}) {
    if (synthetic > 0) bench_check(fill_synthetic(be, *st, synthetic, sm.seed + 9));
    for (int begin = 0; synthetic == 0 && begin < prompt_len; begin += m.max_rows()) {
      const int n = std::min(m.max_rows(), prompt_len - begin);
      run_step(m, *st, std::span(prompt).subspan(static_cast<size_t>(begin), static_cast<size_t>(n)),
               LogitRows::kNone, ids, /*prefill=*/true);
    }
  }
  const std::vector<int32_t> toks = synth_tokens(sm.seed + 8, V, R);
  auto logits_of = [&](SequenceState& st, std::span<const int32_t> t) {
    std::vector<int32_t> pos(t.size());
    for (size_t i = 0; i < t.size(); ++i) pos[i] = st.length() + static_cast<int32_t>(i);
    bench_check(be.begin_step());
    Expected<StepOutput> o = m.forward(st, t, pos, {.logits = LogitRows::kAll, .tap = {}});
    bench_check(be.end_step());
    if (!o) bench_fail(o.status());
    std::vector<float> out(static_cast<size_t>(o->logits.rows * o->logits.cols));
    bench_check(be.download(out.data(), o->logits));
    return out;
  };
  const std::vector<float> wide_logits = logits_of(wide, toks);
  std::vector<float> narrow_logits;
  for (int r = 0; r < R; ++r) {
    const std::vector<float> row = logits_of(narrow, std::span(toks).subspan(static_cast<size_t>(r), 1));
    narrow_logits.insert(narrow_logits.end(), row.begin(), row.end());
  }
  auto bytes_of = [&](const Tensor& t) {
    std::vector<uint8_t> out(static_cast<size_t>(t.nbytes()));
    bench_check(be.download(out.data(), t));
    return out;
  };
  const bool logits_equal =
      wide_logits.size() == narrow_logits.size() &&
      std::memcmp(wide_logits.data(), narrow_logits.data(), wide_logits.size() * sizeof(float)) == 0;
  bool kv_equal = true, gdn_equal = true;
  int kv_layers = 0, gdn_layers = 0;
  const int used = prompt_len + R;
  for (size_t l = 0; l < sm.config.layer_types.size(); ++l) {
    const int li = static_cast<int>(l);
    if (sm.config.layer_types[l] == LayerType::kFullAttention) {
      ++kv_layers;
      const KvCache kw = wide.kv(li), kn = narrow.kv(li);
      kv_equal = kv_equal && bytes_of(kw.k.row_slice(0, used)) == bytes_of(kn.k.row_slice(0, used)) &&
                 bytes_of(kw.v.row_slice(0, used)) == bytes_of(kn.v.row_slice(0, used));
    } else {
      ++gdn_layers;
      const GdnState gw = wide.gdn(li), gn = narrow.gdn(li);
      gdn_equal = gdn_equal && bytes_of(gw.conv) == bytes_of(gn.conv) &&
                  bytes_of(gw.recurrent) == bytes_of(gn.recurrent);
    }
  }
  const bool pass = logits_equal && kv_equal && gdn_equal;
  fmt::print(stderr,
             "row-exact check ({} rows vs {} one-row steps after {} tokens, {} KV + {} GDN layers): {}\n", R,
             R, prompt_len, kv_layers, gdn_layers, pass ? "bitwise equal" : "DIFFERENT");
  return {{"rows", R},
          {"prompt_tokens", prompt_len},
          {"fill", synthetic > 0 ? "synthetic" : "real"},
          {"logits_equal", logits_equal},
          {"kv_equal", kv_equal},
          {"gdn_state_equal", gdn_equal},
          {"kv_layers", kv_layers},
          {"gdn_layers", gdn_layers},
          {"pass", pass}};
}

}  // namespace pd::cli
