// Test-only: random and edge-case inputs for the sample op (backend.h SampleArgs), and a runner that feeds a
// case to a backend and returns every word the op writes. Shared by the CUDA test (CUDA against the CPU
// reference) and the emulated test (the CUDA kernels run on the CPU against the reference).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "puredrive/backend/backend.h"
#include "puredrive/backend/cpu/sampling.h"

namespace pd::sampletest {

struct SampleCase {
  std::string name;
  SampleRule rule = SampleRule::kGreedy;
  int32_t faulty = 0;
  SampleParams target, draft;
  int rows = 1;
  int vocab = 0;
  std::vector<float> logits;        // [rows, vocab]
  std::vector<float> draft_logits;  // [rows - 1, vocab] or empty
  std::vector<int32_t> drafts;      // size >= prior + rows - 1 (+ 1 with write_draft), or empty
  int32_t prior = 0;
  bool write_draft = false;
  std::vector<float> bias;       // [vocab] or empty
  std::vector<int32_t> history;  // [vocab] or empty
  bool commit = false;
  std::vector<int64_t> control;  // kSampleControlWords
  int32_t logprobs = -1;
};

// Everything the op writes.
struct SampleResult {
  std::vector<int32_t> out, drafts, history;
  bool operator==(const SampleResult&) const = default;
};

inline std::string describe(const SampleResult& r) {
  std::string s = "out";
  for (size_t i = 0; i < std::min<size_t>(r.out.size(), 12); ++i) s += fmt::format(" {}", r.out[i]);
  return s;
}

// A case's tensors in a backend's memory, and the op's arguments over them.
struct SampleBuffers {
  Buffer logits, draft_logits, drafts, bias, history, control, out;
  SampleArgs args;
};

inline Expected<SampleBuffers> upload_case(Backend& be, const SampleCase& c) {
  auto up_f32 = [&](const std::vector<float>& v, int64_t rows) -> Expected<Buffer> {
    PD_ASSIGN_OR_RETURN(Buffer b, be.alloc(DType::kF32, rows, static_cast<int64_t>(v.size()) / rows));
    PD_TRY(be.upload(b.tensor(), v.data()));
    return b;
  };
  auto up_i32 = [&](const std::vector<int32_t>& v) -> Expected<Buffer> {
    PD_ASSIGN_OR_RETURN(Buffer b, be.alloc(DType::kI32, 1, static_cast<int64_t>(v.size())));
    PD_TRY(be.upload(b.tensor(), v.data()));
    return b;
  };
  SampleBuffers b;
  SampleArgs& a = b.args;
  a.rule = c.rule;
  a.faulty = c.faulty;
  a.target = c.target;
  a.draft = c.draft;
  a.prior = c.prior;
  a.write_draft = c.write_draft;
  a.commit = c.commit;
  a.logprobs = c.logprobs;
  PD_ASSIGN_OR_RETURN(b.logits, up_f32(c.logits, c.rows));
  a.logits = b.logits.tensor();
  if (!c.draft_logits.empty()) {
    PD_ASSIGN_OR_RETURN(b.draft_logits, up_f32(c.draft_logits, c.rows - 1));
    a.draft_logits = b.draft_logits.tensor();
  }
  if (!c.drafts.empty()) {
    PD_ASSIGN_OR_RETURN(b.drafts, up_i32(c.drafts));
    a.drafts = b.drafts.tensor();
  }
  if (!c.bias.empty()) {
    PD_ASSIGN_OR_RETURN(b.bias, up_f32(c.bias, 1));
    a.bias = b.bias.tensor();
  }
  if (!c.history.empty()) {
    PD_ASSIGN_OR_RETURN(b.history, up_i32(c.history));
    a.history = b.history.tensor();
  }
  PD_ASSIGN_OR_RETURN(b.control, be.alloc(DType::kI64, 1, kSampleControlWords));
  PD_TRY(be.upload(b.control.tensor(), c.control.data()));
  a.control = b.control.tensor();
  PD_ASSIGN_OR_RETURN(b.out, be.alloc(DType::kI32, 1, sample_out_words(c.rows, c.logprobs)));
  a.out = b.out.tensor();
  return b;
}

inline Expected<SampleResult> read_result(Backend& be, const SampleBuffers& b) {
  SampleResult r;
  r.out.resize(static_cast<size_t>(b.args.out.cols));
  PD_TRY(be.download(r.out.data(), b.args.out));
  if (!b.drafts.empty()) {
    r.drafts.resize(static_cast<size_t>(b.args.drafts.cols));
    PD_TRY(be.download(r.drafts.data(), b.args.drafts));
  }
  if (!b.history.empty()) {
    r.history.resize(static_cast<size_t>(b.args.history.cols));
    PD_TRY(be.download(r.history.data(), b.args.history));
  }
  return r;
}

// Runs the case on `be` through tensors in its memory.
inline Expected<SampleResult> run_on(Backend& be, const SampleCase& c) {
  PD_ASSIGN_OR_RETURN(SampleBuffers b, upload_case(be, c));
  PD_TRY(be.sample(b.args));
  return read_result(be, b);
}

// ---- Case generation ----

class CaseMaker {
 public:
  explicit CaseMaker(uint64_t seed) : gen_(seed) {}

  template <typename T>
  T pick(std::initializer_list<T> v) {
    std::uniform_int_distribution<size_t> d(0, v.size() - 1);
    return *(v.begin() + static_cast<std::ptrdiff_t>(d(gen_)));
  }
  double unit() { return std::uniform_real_distribution<double>(0.0, 1.0)(gen_); }
  int32_t token(int vocab) { return std::uniform_int_distribution<int32_t>(0, vocab - 1)(gen_); }
  // A uniform on the grid of bits_to_open_unit, sometimes at its extremes.
  double uniform() {
    const int kind = std::uniform_int_distribution<int>(0, 9)(gen_);
    if (kind == 0) return bits_to_open_unit(0);
    if (kind == 1) return bits_to_open_unit(~0ull);
    return bits_to_open_unit(gen_());
  }

  // A logits row in one of several shapes: smooth, coarse ties, flat, sparse -inf, spiky.
  std::vector<float> row(int vocab, int shape) {
    std::vector<float> z(static_cast<size_t>(vocab));
    std::normal_distribution<double> normal(0.0, 1.0);
    const double scale = pick({0.3, 2.0, 6.0});
    for (float& x : z) {
      const double n = normal(gen_);
      switch (shape) {
        case 0:
          x = static_cast<float>(scale * n);
          break;
        case 1:  // ties: a few distinct values
          x = static_cast<float>(std::round(n * 2.0) * 0.5);
          break;
        case 2:  // flat
          x = 1.25f;
          break;
        case 3:  // sparse: most tokens impossible
          x = unit() < 0.9 ? -std::numeric_limits<float>::infinity() : static_cast<float>(scale * n);
          break;
        default:  // spiky: huge range, zeros of both signs
          x = static_cast<float>(n * 30.0);
          if (unit() < 0.05) x = unit() < 0.5 ? 0.0f : -0.0f;
          break;
      }
    }
    if (shape == 3) z[static_cast<size_t>(token(vocab))] = 0.5f;  // never all -inf
    return z;
  }

  SampleParams params(bool allow_greedy) {
    SampleParams p;
    p.temperature = pick({0.0f, 1e-6f, 0.01f, 0.3f, 0.7f, 1.0f, 1.7f});
    if (!allow_greedy && p.temperature == 0.0f) p.temperature = 0.8f;
    p.top_k = pick({0, 0, 1, 2, 20, 100, 5000});
    p.top_p = pick({1.0f, 1.0f, 0.999f, 0.95f, 0.5f, 0.1f, 1e-6f});
    p.min_p = pick({0.0f, 0.0f, 0.01f, 0.3f, 1.0f});
    if (unit() < 0.35) {
      p.repetition_penalty = pick({0.8f, 1.3f, 2.0f});
      p.presence_penalty = pick({0.0f, -0.5f, 0.7f});
      p.frequency_penalty = pick({0.0f, 0.4f, 1.5f});
    }
    return p;
  }

  std::vector<int64_t> control(int rows) {
    std::vector<int64_t> c(kSampleControlWords, 0);
    c[kControlSeed] = static_cast<int64_t>(gen_());
    c[kControlPosition] = static_cast<int64_t>(gen_() % 100000);
    for (int j = 0; j < rows; ++j) c[kControlUniforms + j] = static_cast<int64_t>(double_bits(uniform()));
    return c;
  }

  // A full case: rows target rows, drafts drawn from the draft rows (kTokenwise / kBlock) or chosen to hit
  // the target's argmax at random depths, optional history, bias, logprobs.
  SampleCase make(int vocab, int rows, SampleRule rule, const std::string& name) {
    SampleCase c;
    c.name = name;
    c.rule = rule;
    c.vocab = vocab;
    c.rows = rows;
    const bool needs_q = rule == SampleRule::kTokenwise || rule == SampleRule::kBlock;
    c.target = params(rule != SampleRule::kGreedy);
    if (rule == SampleRule::kGreedy) c.target.temperature = 0.0f;
    c.draft = needs_q ? params(true) : SampleParams{};
    if (needs_q) {  // the same penalties on both sides, as the generator does
      c.draft.repetition_penalty = c.target.repetition_penalty;
      c.draft.presence_penalty = c.target.presence_penalty;
      c.draft.frequency_penalty = c.target.frequency_penalty;
    }
    const int shape = pick({0, 0, 1, 2, 3, 4});
    for (int j = 0; j < rows; ++j) {
      const std::vector<float> z = row(vocab, shape == 2 && j > 0 ? 0 : shape);
      c.logits.insert(c.logits.end(), z.begin(), z.end());
    }
    if (unit() < 0.2) {
      c.bias.assign(static_cast<size_t>(vocab), 0.0f);
      for (int i = 0; i < 5; ++i)
        c.bias[static_cast<size_t>(token(vocab))] = pick({-100.0f, -3.0f, 2.5f, 100.0f});
    }
    const bool penalised = c.target.penalised() || c.draft.penalised();
    if (penalised || unit() < 0.2) {
      c.history.assign(static_cast<size_t>(vocab), 0);
      const int n = pick({3, 40, 400});
      for (int i = 0; i < n; ++i) {
        int32_t& h = c.history[static_cast<size_t>(token(vocab))];
        if (unit() < 0.4) h |= kHistoryPromptBit;
        if (unit() < 0.7) h += static_cast<int32_t>(1 + gen_() % 50);
      }
      c.commit = unit() < 0.7;
    }
    c.prior = needs_q || rows > 1 ? 0 : pick({0, 0, 1, 3});
    c.write_draft = rows == 1 && unit() < 0.5;
    c.control = control(rows);
    c.logprobs = pick({-1, -1, 0, 3, 20});
    const int k = rows - 1;
    c.drafts.assign(static_cast<size_t>(c.prior + k + (c.write_draft ? 1 : 0)), -1);
    for (int i = 0; i < c.prior; ++i) c.drafts[static_cast<size_t>(i)] = token(vocab);
    if (needs_q) {
      // Draft rows: a perturbation of the target's, each draft drawn from its processed row.
      for (int j = 0; j < k; ++j) {
        std::vector<float> q(c.logits.begin() + static_cast<std::ptrdiff_t>(j) * vocab,
                             c.logits.begin() + static_cast<std::ptrdiff_t>(j + 1) * vocab);
        for (float& x : q) x += static_cast<float>(unit() < 0.5 ? 0.0 : 0.7 * (unit() - 0.5));
        c.draft_logits.insert(c.draft_logits.end(), q.begin(), q.end());
        TokenDistribution d;
        const sampling::RowStatus s = sampling::process_row(q, c.draft, bias_list(c), penalties(c, j), &d);
        c.drafts[static_cast<size_t>(j)] = s.ok() ? sampling::draw(d, uniform()) : token(vocab);
      }
    } else {
      for (int j = 0; j < k; ++j) {
        TokenDistribution d;
        const std::span<const float> z(c.logits.data() + static_cast<std::ptrdiff_t>(j) * vocab,
                                       static_cast<size_t>(vocab));
        const sampling::RowStatus s = sampling::process_row(z, c.target, bias_list(c), penalties(c, j), &d);
        c.drafts[static_cast<size_t>(j)] = s.ok() && unit() < 0.7 ? d.argmax : token(vocab);
      }
    }
    return c;
  }

  std::mt19937_64& gen() { return gen_; }

 private:
  static std::vector<sampling::LogitBias> bias_list(const SampleCase& c) {
    std::vector<sampling::LogitBias> b;
    for (int32_t t = 0; t < static_cast<int32_t>(c.bias.size()); ++t) {
      if (c.bias[static_cast<size_t>(t)] != 0.0f) b.push_back({t, c.bias[static_cast<size_t>(t)]});
    }
    return b;
  }
  // The history plus drafts[0 .. n) (prior is 0 when drafts are drawn here).
  static std::vector<sampling::Penalty> penalties(const SampleCase& c, int n) {
    std::vector<sampling::Penalty> p;
    if (c.history.empty()) return p;
    std::vector<int32_t> h = c.history;
    for (int i = 0; i < n; ++i) ++h[static_cast<size_t>(c.drafts[static_cast<size_t>(i)])];
    for (int32_t t = 0; t < static_cast<int32_t>(h.size()); ++t) {
      const int32_t v = h[static_cast<size_t>(t)];
      if (v != 0) p.push_back({t, v & (kHistoryPromptBit - 1), (v & kHistoryPromptBit) != 0});
    }
    return p;
  }

  std::mt19937_64 gen_;
};

// The mixed bag the tests run: every rule, k = 0..4, draws with prior drafts, errors included.
inline std::vector<SampleCase> mixed_cases(uint64_t seed, int count, std::initializer_list<int> vocabs) {
  CaseMaker m(seed);
  std::vector<SampleCase> cases;
  for (int i = 0; i < count; ++i) {
    const int vocab = m.pick(vocabs);
    const SampleRule rule =
        m.pick({SampleRule::kGreedy, SampleRule::kTokenwise, SampleRule::kBlock, SampleRule::kSeeded});
    const int rows = m.pick({1, 1, 2, 3, 4, 5});
    SampleCase c = m.make(vocab, rows, rule,
                          fmt::format("case {} V={} R={} rule {}", i, vocab, rows, static_cast<int>(rule)));
    if (rule == SampleRule::kBlock && rows > 1 && m.unit() < 0.2) c.faulty = m.pick({1, 2});
    if (rule == SampleRule::kTokenwise && rows > 1 && m.unit() < 0.2) c.faulty = 3;
    cases.push_back(std::move(c));
  }
  return cases;
}

// Selection at its hardest: rows of many exact ties (flat, coarse) or near-ties, with top_k and top_p cutting
// inside them, so that the radix search runs through every digit, the tie shortcut and the id digits.
inline std::vector<SampleCase> deep_cases(uint64_t seed, int vocab) {
  CaseMaker m(seed);
  std::vector<SampleCase> cases;
  for (int shape : {0, 1, 2}) {
    for (int32_t top_k : {0, 3, vocab / 2 + 1}) {
      for (float top_p : {1.0f, 0.9f, 0.3f}) {
        if (top_k == 0 && top_p == 1.0f) continue;
        const SampleRule rule = m.pick({SampleRule::kSeeded, SampleRule::kBlock, SampleRule::kTokenwise});
        SampleCase c = m.make(
            vocab, 2, rule, fmt::format("deep V={} shape {} top_k {} top_p {}", vocab, shape, top_k, top_p));
        for (int j = 0; j < c.rows; ++j) {
          std::vector<float> z = m.row(vocab, shape);
          if (shape == 0) {
            for (float& x : z) x *= 0.05f;  // near-ties: weights within a few percent
          }
          std::copy(z.begin(), z.end(), c.logits.begin() + static_cast<std::ptrdiff_t>(j) * vocab);
        }
        c.target = SampleParams{};
        c.target.top_k = top_k;
        c.target.top_p = top_p;
        c.rule = SampleRule::kSeeded;  // new rows: the drafts were not drawn from any q
        c.draft_logits.clear();
        cases.push_back(std::move(c));
      }
    }
  }
  return cases;
}

// Rows and drafts that must fail, one way each.
inline std::vector<SampleCase> error_cases(int vocab) {
  CaseMaker m(99);
  std::vector<SampleCase> cases;
  SampleCase nan = m.make(vocab, 3, SampleRule::kBlock, "NaN in row 1");
  nan.logits[static_cast<size_t>(vocab) + 7] = std::numeric_limits<float>::quiet_NaN();
  nan.logits[static_cast<size_t>(vocab) + 3] = std::numeric_limits<float>::infinity();
  cases.push_back(nan);
  SampleCase masked = m.make(vocab, 2, SampleRule::kGreedy, "row 1 all -inf");
  std::fill(masked.logits.begin() + vocab, masked.logits.end(), -std::numeric_limits<float>::infinity());
  cases.push_back(masked);
  SampleCase bad = m.make(vocab, 3, SampleRule::kSeeded, "draft outside the vocabulary");
  bad.drafts[1] = vocab + 5;
  cases.push_back(bad);
  SampleCase q0 = m.make(vocab, 3, SampleRule::kTokenwise, "draft with q = 0");
  q0.target.temperature = 1.0f;
  q0.draft = SampleParams{};
  q0.draft.temperature = 0.0f;  // q is a point mass on each row's argmax
  q0.drafts[0] = 0;
  q0.draft_logits[0] = -1e30f;
  cases.push_back(q0);
  return cases;
}

}  // namespace pd::sampletest
