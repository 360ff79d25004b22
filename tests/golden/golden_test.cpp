// Golden tests: every fixture in tests/fixtures/ (a directory with reference.json) is loaded as a model and
// run on the CPU backend; per-layer hidden states, final-norm hidden, logits, the 64-token greedy
// continuation and the MTP head (prompt pass + chained drafts) are compared with transformers' outputs
// (tests/fixtures/FORMAT.md); the same for the prompt as a prefill step (chunked GDN form). Also: the prompt
// processed in one step equals the prompt processed token by token, bitwise.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "golden/fixture_util.h"

namespace pd {
namespace {

using golden::Fixture;

class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, MatchesReference) {
  Expected<std::unique_ptr<Fixture>> fx_or = Fixture::open(GetParam());
  ASSERT_TRUE(fx_or.has_value()) << fx_or.status().to_string();
  Fixture& fx = **fx_or;
  const double tol = fx.tolerance;
  const int V = fx.config().vocab_size;
  double worst = 0;  // largest relative error seen, reported for the test log
  auto check = [&](double err, const std::string& what) {
    worst = std::max(worst, err);
    EXPECT_LE(err, tol) << what;
  };
  for (const std::string& p : fx.prompts) {
    SCOPED_TRACE(fx.name + " prompt " + p);
    const std::vector<int32_t> ids = fx.ref_ints(p + ".input_ids");
    const int T = static_cast<int>(ids.size());
    std::vector<int32_t> pos(ids.size());
    for (int i = 0; i < T; ++i) pos[static_cast<size_t>(i)] = i;
    // The stored rows of the row-indexed reference tensors (FORMAT.md: optional p.rows, else all T).
    std::vector<int32_t> rows = pos;
    if (fx.reference.find(p + ".rows") != nullptr) rows = fx.ref_ints(p + ".rows");
    auto pick = [&](const std::vector<float>& all) { return golden::select_rows(all, T, rows); };

    SequenceState st = fx.new_state();
    std::vector<std::vector<float>> layer_out(static_cast<size_t>(fx.config().num_hidden_layers));
    ForwardOptions opts{.logits = LogitRows::kAll, .tap = [&](std::string_view name, const Tensor& t) {
                          if (name.starts_with("L") && name.ends_with(".out")) {
                            const int l = std::stoi(std::string(name.substr(1)));
                            layer_out[static_cast<size_t>(l)] = fx.download(t);
                          }
                        }};
    Expected<StepOutput> out = fx.model->forward(st, ids, pos, opts);
    ASSERT_TRUE(out.has_value()) << out.status().to_string();
    for (size_t l = 0; l < layer_out.size(); ++l) {
      check(golden::rel_err(pick(layer_out[l]), fx.ref_floats(fmt::format("{}.hidden.{}", p, l))),
            fmt::format("layer {}", l));
    }
    const std::vector<float> hidden = fx.download(out->hidden);
    const std::vector<float> logits = fx.download(out->logits);
    check(golden::rel_err(pick(hidden), fx.ref_floats(p + ".final_hidden")), "final hidden");
    check(golden::rel_err(pick(logits), fx.ref_floats(p + ".logits")), "logits");

    // MTP head over the prompt: row i = (x_{i+1}, final_hidden[i], position i); the last row takes greedy[0].
    const std::vector<int32_t> greedy_ref = fx.ref_ints(p + ".greedy");
    const int32_t first = golden::argmax(logits.data() + static_cast<size_t>(T - 1) * V, V);
    EXPECT_EQ(first, greedy_ref[0]);
    if (fx.model->has_mtp()) {
      std::vector<int32_t> next(ids.begin() + 1, ids.end());
      next.push_back(first);
      Expected<StepOutput> m = fx.model->mtp_forward(st, next, pos, out->hidden);
      ASSERT_TRUE(m.has_value()) << m.status().to_string();
      check(golden::rel_err(pick(fx.download(m->logits)), fx.ref_floats(p + ".mtp.logits")), "mtp logits");
      check(golden::rel_err(pick(fx.download(m->hidden)), fx.ref_floats(p + ".mtp.hidden")), "mtp hidden");
      const std::vector<int32_t> chain_ref = fx.ref_ints(p + ".mtp.chain_tokens");
      const std::vector<float> chain_logits_ref = fx.ref_floats(p + ".mtp.chain_logits");
      std::vector<float> step_logits = fx.download(m->logits.row_slice(T - 1, 1));
      Tensor prev_hidden = m->hidden.row_slice(T - 1, 1);
      for (size_t j = 0; j < chain_ref.size(); ++j) {
        const std::vector<float> ref_row(chain_logits_ref.begin() + static_cast<int64_t>(j) * V,
                                         chain_logits_ref.begin() + static_cast<int64_t>(j + 1) * V);
        check(golden::rel_err(step_logits, ref_row), fmt::format("chain step {}", j + 1));
        const int32_t d = golden::argmax(step_logits.data(), V);
        EXPECT_EQ(d, chain_ref[j]) << "chain step " << j + 1;
        if (j + 1 == chain_ref.size()) break;
        const int32_t tok[1] = {d};
        const int32_t p1[1] = {T - 1 + static_cast<int32_t>(j) + 1};
        Expected<StepOutput> c = fx.model->mtp_forward(st, tok, p1, prev_hidden);
        ASSERT_TRUE(c.has_value()) << c.status().to_string();
        step_logits = fx.download(c->logits);
        prev_hidden = c->hidden;
      }
    }

    // Greedy continuation, one-row decode steps.
    std::vector<int32_t> greedy = {first};
    while (greedy.size() < greedy_ref.size()) {
      const int32_t tok[1] = {greedy.back()};
      const int32_t at[1] = {st.length()};
      Expected<StepOutput> o = fx.model->forward(st, tok, at, {.logits = LogitRows::kLast, .tap = {}});
      ASSERT_TRUE(o.has_value()) << o.status().to_string();
      greedy.push_back(golden::argmax(fx.download(o->logits).data(), V));
    }
    EXPECT_EQ(greedy, greedy_ref);

    // The prompt as a prefill step (chunked GDN form, spec §5.7) against the same reference.
    {
      SequenceState sp = fx.new_state();
      ForwardOptions popts = opts;
      popts.prefill = true;
      Expected<StepOutput> po = fx.model->forward(sp, ids, pos, popts);
      ASSERT_TRUE(po.has_value()) << po.status().to_string();
      for (size_t l = 0; l < layer_out.size(); ++l) {
        check(golden::rel_err(pick(layer_out[l]), fx.ref_floats(fmt::format("{}.hidden.{}", p, l))),
              fmt::format("prefill: layer {}", l));
      }
      const std::vector<float> pl = fx.download(po->logits);
      check(golden::rel_err(pick(pl), fx.ref_floats(p + ".logits")), "prefill: logits");
      EXPECT_EQ(golden::argmax(pl.data() + static_cast<size_t>(T - 1) * V, V), greedy_ref[0]) << "prefill";
    }
    std::printf(
        "%s %s: max relative error %.3g (tolerance %.3g), %zu greedy tokens (and as a prefill step)\n",
        fx.name.c_str(), p.c_str(), worst, tol, greedy.size());

    // Prefill in one step == token by token, bitwise (row-exact step). Runs last: forward() reuses the
    // workspace that out->hidden points into.
    {
      SequenceState st1 = fx.new_state();
      for (int i = 0; i < T; ++i) {
        Expected<StepOutput> o1 = fx.model->forward(st1, std::span(ids).subspan(static_cast<size_t>(i), 1),
                                                    std::span(pos).subspan(static_cast<size_t>(i), 1));
        ASSERT_TRUE(o1.has_value()) << o1.status().to_string();
        const std::vector<float> row = fx.download(o1->logits);
        ASSERT_EQ(std::memcmp(row.data(), logits.data() + static_cast<size_t>(i) * V, sizeof(float) * V), 0)
            << "token-by-token logits differ from the one-step prefill at row " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Golden, ::testing::ValuesIn(golden::fixture_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string s = i.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace pd
