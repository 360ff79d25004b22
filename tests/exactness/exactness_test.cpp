// Row-exactness and rollback (docs/DESIGN.md §4.1-4.2) on every fixture model, CPU backend:
// - every row of an R-row step (R = 2..8) equals the one-row step bitwise: logits, final hidden, KV entries,
//   GDN conv and recurrent states;
// - after an R-row step, rewinding to row j (GDN snapshot + KV truncation) and continuing equals a run that
//   stopped at row j;
// - the MTP head's R-row pass equals its one-row passes;
// - 1, 2 and 4 threads give the same bits;
// - prefill pieces split at multiples of 64 positions give the bits of one piece.
#include <gtest/gtest.h>

#include <random>

#include "golden/fixture_util.h"

namespace pd {
namespace {

using golden::Fixture;

// Everything a step leaves behind, downloaded.
struct Snapshot {
  std::vector<float> logits, hidden;     // of the step's rows
  std::vector<std::vector<uint8_t>> kv;  // per full-attention layer: K and V rows [0, length)
  std::vector<std::vector<float>> gdn;   // per GDN layer: conv window + recurrent state
};

std::vector<uint8_t> kv_prefix(const Fixture& fx, const Tensor& t, int length) {
  std::vector<uint8_t> all(static_cast<size_t>(t.nbytes()));
  PD_ASSERT(fx.backend->download(all.data(), t).is_ok());
  all.resize(static_cast<size_t>(length * t.cols) * dtype_size(t.dtype));
  return all;
}

void capture_state(const Fixture& fx, const SequenceState& st, Snapshot* s) {
  const CacheSpec& spec = st.spec();
  s->kv.clear();
  s->gdn.clear();
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    const int li = static_cast<int>(l);
    if (spec.layers[l] == LayerType::kFullAttention) {
      s->kv.push_back(kv_prefix(fx, st.kv(li).k, st.length()));
      s->kv.push_back(kv_prefix(fx, st.kv(li).v, st.length()));
    } else {
      std::vector<float> g = fx.download(st.gdn(li).conv);
      const std::vector<float> r = fx.download(st.gdn(li).recurrent);
      g.insert(g.end(), r.begin(), r.end());
      s->gdn.push_back(std::move(g));
    }
  }
}

std::vector<int32_t> random_tokens(int vocab, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = dist(rng);
  return t;
}

std::vector<int32_t> iota_from(int first, int n) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[static_cast<size_t>(i)] = first + i;
  return p;
}

// Runs tokens one row at a time; returns the snapshot after every token.
std::vector<Snapshot> one_row_run(Fixture& fx, const std::vector<int32_t>& tokens, DType kv) {
  SequenceState st = fx.new_state(64, kv);
  std::vector<Snapshot> out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::vector<int32_t> pos = iota_from(st.length(), 1);
    Expected<StepOutput> o = fx.model->forward(st, std::span(tokens).subspan(i, 1), pos);
    PD_ASSERT(o.has_value(), "{}", o.status().to_string());
    Snapshot s;
    s.logits = fx.download(o->logits);
    s.hidden = fx.download(o->hidden);
    capture_state(fx, st, &s);
    out.push_back(std::move(s));
  }
  return out;
}

bool same(const std::vector<float>& a, const float* b, size_t n) {
  return a.size() == n && std::memcmp(a.data(), b, n * sizeof(float)) == 0;
}

void expect_same_state(const Snapshot& got, const Snapshot& want, const std::string& where) {
  ASSERT_EQ(got.kv.size(), want.kv.size());
  for (size_t i = 0; i < got.kv.size(); ++i)
    EXPECT_TRUE(got.kv[i] == want.kv[i]) << where << ": KV tensor " << i;
  ASSERT_EQ(got.gdn.size(), want.gdn.size());
  for (size_t i = 0; i < got.gdn.size(); ++i) {
    EXPECT_TRUE(got.gdn[i] == want.gdn[i]) << where << ": GDN state of GDN layer " << i;
  }
}

class Exactness : public ::testing::TestWithParam<std::string> {};

TEST_P(Exactness, MultiRowStepsEqualOneRowSteps) {
  Expected<std::unique_ptr<Fixture>> fx_or = Fixture::open(GetParam(), 2, 16);
  ASSERT_TRUE(fx_or.has_value()) << fx_or.status().to_string();
  Fixture& fx = **fx_or;
  const int V = fx.config().vocab_size;
  const int H = fx.config().hidden_size;
  const int prefix = 3;
  const std::vector<int32_t> tokens = random_tokens(V, prefix + 8 + 4, 7);
  for (DType kv : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(kv));
    const std::vector<Snapshot> ref = one_row_run(fx, tokens, kv);
    for (int R = 2; R <= 8; ++R) {
      SCOPED_TRACE(fmt::format("R = {}", R));
      for (int j : {0, R / 2, R - 1}) {
        SequenceState st = fx.new_state(64, kv);
        // A multi-row prefix step, then the R-row "verify" step.
        ASSERT_TRUE(fx.model->forward(st, std::span(tokens).first(prefix), iota_from(0, prefix)).has_value());
        Expected<StepOutput> o = fx.model->forward(
            st, std::span(tokens).subspan(prefix, static_cast<size_t>(R)), iota_from(prefix, R));
        ASSERT_TRUE(o.has_value()) << o.status().to_string();
        const std::vector<float> logits = fx.download(o->logits), hidden = fx.download(o->hidden);
        for (int r = 0; r < R; ++r) {
          const Snapshot& want = ref[static_cast<size_t>(prefix + r)];
          EXPECT_TRUE(same(want.logits, logits.data() + static_cast<size_t>(r) * V, static_cast<size_t>(V)))
              << "logits of row " << r;
          EXPECT_TRUE(same(want.hidden, hidden.data() + static_cast<size_t>(r) * H, static_cast<size_t>(H)))
              << "hidden of row " << r;
        }
        Snapshot after;
        capture_state(fx, st, &after);
        expect_same_state(after, ref[static_cast<size_t>(prefix + R - 1)], "after the step");

        // Roll back to row j, then continue one row at a time with the sequence's next tokens.
        ASSERT_TRUE(st.rewind(prefix + j + 1).is_ok());
        Snapshot rewound;
        capture_state(fx, st, &rewound);
        expect_same_state(rewound, ref[static_cast<size_t>(prefix + j)], fmt::format("rewound to row {}", j));
        for (int t = prefix + j + 1; t < prefix + j + 4; ++t) {
          Expected<StepOutput> c =
              fx.model->forward(st, std::span(tokens).subspan(static_cast<size_t>(t), 1), iota_from(t, 1));
          ASSERT_TRUE(c.has_value()) << c.status().to_string();
          EXPECT_TRUE(
              same(ref[static_cast<size_t>(t)].logits, fx.download(c->logits).data(), static_cast<size_t>(V)))
              << "token " << t << " after rewinding to row " << j;
        }
      }
    }
  }
}

TEST_P(Exactness, RewindOutsideTheLastStepIsAnError) {
  Expected<std::unique_ptr<Fixture>> fx_or = Fixture::open(GetParam(), 1, 16);
  ASSERT_TRUE(fx_or.has_value()) << fx_or.status().to_string();
  Fixture& fx = **fx_or;
  const std::vector<int32_t> tokens = random_tokens(fx.config().vocab_size, 6, 3);
  SequenceState st = fx.new_state();
  ASSERT_TRUE(fx.model->forward(st, std::span(tokens).first(2), iota_from(0, 2)).has_value());
  ASSERT_TRUE(fx.model->forward(st, std::span(tokens).subspan(2, 4), iota_from(2, 4)).has_value());
  EXPECT_FALSE(st.rewind(2).is_ok());  // before the last step's first row
  EXPECT_FALSE(st.rewind(7).is_ok());  // beyond the sequence
  EXPECT_TRUE(st.rewind(4).is_ok());
  // Positions must continue the sequence.
  EXPECT_FALSE(fx.model->forward(st, std::span(tokens).first(1), iota_from(7, 1)).has_value());
}

TEST_P(Exactness, MtpRowsEqualOneRowPasses) {
  Expected<std::unique_ptr<Fixture>> fx_or = Fixture::open(GetParam(), 2, 16);
  ASSERT_TRUE(fx_or.has_value()) << fx_or.status().to_string();
  Fixture& fx = **fx_or;
  if (!fx.model->has_mtp()) GTEST_SKIP() << "no MTP head";
  const int V = fx.config().vocab_size, H = fx.config().hidden_size;
  const int n = 8;
  const std::vector<int32_t> tokens = random_tokens(V, n + 1, 11);
  SequenceState st = fx.new_state();
  Expected<StepOutput> main = fx.model->forward(st, std::span(tokens).first(n), iota_from(0, n));
  ASSERT_TRUE(main.has_value());
  // Keep the main hidden in a buffer of our own: MTP passes are interleaved below.
  Buffer hidden = fx.backend->alloc(DType::kF32, n, H).value();
  ASSERT_TRUE(fx.backend->copy(hidden.tensor(), main->hidden).is_ok());
  const std::span<const int32_t> next = std::span(tokens).subspan(1, static_cast<size_t>(n));

  Expected<StepOutput> all = fx.model->mtp_forward(st, next, iota_from(0, n), hidden.tensor());
  ASSERT_TRUE(all.has_value()) << all.status().to_string();
  const std::vector<float> all_logits = fx.download(all->logits), all_hidden = fx.download(all->hidden);
  // Rewrite the MTP KV row by row from position 0 (the head's KV is overwritten in place).
  for (int r = 0; r < n; ++r) {
    Expected<StepOutput> one = fx.model->mtp_forward(st, next.subspan(static_cast<size_t>(r), 1),
                                                     iota_from(r, 1), hidden.row_slice(r, 1));
    ASSERT_TRUE(one.has_value()) << one.status().to_string();
    EXPECT_TRUE(same(fx.download(one->logits), all_logits.data() + static_cast<size_t>(r) * V,
                     static_cast<size_t>(V)))
        << "MTP logits of row " << r;
    EXPECT_TRUE(same(fx.download(one->hidden), all_hidden.data() + static_cast<size_t>(r) * H,
                     static_cast<size_t>(H)))
        << "MTP hidden of row " << r;
  }
  // A gap in the MTP cache is refused.
  EXPECT_FALSE(
      fx.model->mtp_forward(st, next.first(1), iota_from(n + 1, 1), hidden.row_slice(0, 1)).has_value());
}

TEST_P(Exactness, ThreadCountDoesNotChangeBits) {
  std::vector<float> first;
  for (int threads : {1, 2, 4}) {
    Expected<std::unique_ptr<Fixture>> fx_or = Fixture::open(GetParam(), threads, 16);
    ASSERT_TRUE(fx_or.has_value()) << fx_or.status().to_string();
    Fixture& fx = **fx_or;
    const std::vector<int32_t> tokens = random_tokens(fx.config().vocab_size, 12, 5);
    SequenceState st = fx.new_state();
    Expected<StepOutput> o = fx.model->forward(st, tokens, iota_from(0, 12));
    ASSERT_TRUE(o.has_value());
    std::vector<float> logits = fx.download(o->logits);
    if (fx.model->has_mtp()) {
      std::vector<int32_t> next(tokens.begin() + 1, tokens.end());
      next.push_back(0);
      Expected<StepOutput> m = fx.model->mtp_forward(st, next, iota_from(0, 12), o->hidden);
      ASSERT_TRUE(m.has_value());
      const std::vector<float> ml = fx.download(m->logits);
      logits.insert(logits.end(), ml.begin(), ml.end());
    }
    if (first.empty()) first = logits;
    EXPECT_TRUE(same(first, logits.data(), logits.size())) << threads << " threads";
  }
}

// Prefill chunking invariance (docs/DESIGN.md §4.6), CPU: a prompt prefilled in pieces split at multiples of
// 64 positions, with GDN chunks aligned to absolute positions, leaves bitwise the KV cache and GDN states of
// one piece and gives the same next-token logits; from position 0 and after 37 decode steps (a partial first
// chunk), with pieces of any row count.
TEST_P(Exactness, PrefillPiecesAtMultiplesOf64GiveTheSameBits) {
  Expected<std::unique_ptr<Fixture>> fx_or = Fixture::open(GetParam(), 2, 200);
  ASSERT_TRUE(fx_or.has_value()) << fx_or.status().to_string();
  Fixture& fx = **fx_or;
  const std::vector<int32_t> tokens = random_tokens(fx.config().vocab_size, 201, 9);
  // Each entry is a prefill piece of that many rows, or (negative) that many one-row decode steps: 200
  // tokens, then the last one as a decode step.
  auto run = [&](const std::vector<int>& steps) {
    SequenceState st = fx.new_state(256, DType::kBF16);
    Snapshot s;
    for (int rows : steps) {
      const int n = rows < 0 ? 1 : rows;
      for (int rep = 0; rep < (rows < 0 ? -rows : 1); ++rep) {
        const int at = st.length();
        Expected<StepOutput> o =
            fx.model->forward(st, std::span(tokens).subspan(static_cast<size_t>(at), static_cast<size_t>(n)),
                              iota_from(at, n), {.logits = LogitRows::kLast, .tap = {}, .prefill = rows > 0});
        PD_ASSERT(o.has_value(), "{}", o.status().to_string());
        s.logits = fx.download(o->logits);
      }
    }
    PD_ASSERT(st.length() == 201);
    capture_state(fx, st, &s);
    return s;
  };
  const std::vector<std::vector<std::vector<int>>> groups = {
      {{200, -1}, {128, 72, -1}, {64, 64, 64, 8, -1}},
      {{-37, 163, -1}, {-37, 27, 136, -1}, {-37, 27, 64, 64, 8, -1}},
  };
  for (const auto& group : groups) {
    const Snapshot one = run(group.front());
    for (size_t i = 1; i < group.size(); ++i) {
      const Snapshot other = run(group[i]);
      const std::string where =
          fmt::format("{} split {}", group.front().front() < 0 ? "after 37" : "from 0", i);
      expect_same_state(other, one, where);
      EXPECT_TRUE(same(other.logits, one.logits.data(), one.logits.size())) << where << ": logits";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Exactness, ::testing::ValuesIn(golden::fixture_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string s = i.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace pd
