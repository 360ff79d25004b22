// Shared by the generator exactness tests: a fixture model with a Generator on the CPU backend.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "golden/fixture_util.h"
#include "puredrive/decode/exactness_gates.h"
#include "puredrive/decode/generator.h"
#include "puredrive/decode/scripted_drafter.h"

namespace pd::exactness {

// The sanitizer job builds Debug (-O0) + ASan/UBSan, which runs these tests ~20x slower. There they check
// memory safety on shorter runs of the same code paths; the full-size claims (256 tokens, 20,000 samples,
// the trained model) are made by the optimized build, which defines NDEBUG.
#ifdef NDEBUG
inline constexpr bool kFullSize = true;
#else
inline constexpr bool kFullSize = false;
#endif
inline int full_or(int full, int reduced) {
  return kFullSize ? full : reduced;
}
// The trained tiny coder is 30x the size of the random fixtures; the reduced runs leave it out.
inline bool skip_in_reduced_run(const std::string& fixture) {
  return !kFullSize && fixture == "tiny-coder";
}

struct GeneratorFixture {
  std::unique_ptr<golden::Fixture> fx;
  std::unique_ptr<Generator> gen;

  // threads = 1: the fixture models are so small that thread hand-offs cost more than they save.
  static std::unique_ptr<GeneratorFixture> open(const std::string& name, int ctx_size = 512,
                                                int threads = 1) {
    auto g = std::make_unique<GeneratorFixture>();
    Expected<std::unique_ptr<golden::Fixture>> fx = golden::Fixture::open(name, threads, 16);
    EXPECT_TRUE(fx.has_value()) << fx.status().to_string();
    if (!fx) return nullptr;
    g->fx = std::move(*fx);
    Expected<std::unique_ptr<Generator>> gen = Generator::create(
        *g->fx->model, {.ctx_size = ctx_size, .kv_dtype = DType::kF32, .max_draft = 4, .mtp = true});
    EXPECT_TRUE(gen.has_value()) << gen.status().to_string();
    if (!gen) return nullptr;
    g->gen = std::move(*gen);
    return g;
  }

  int vocab() const { return fx->config().vocab_size; }

  // The fixture's prompts (1, 7 and 110 tokens).
  std::vector<std::vector<int32_t>> prompts() const {
    std::vector<std::vector<int32_t>> out;
    for (const std::string& p : fx->prompts) out.push_back(fx->ref_ints(p + ".input_ids"));
    return out;
  }
};

// The committed part of a sequence state, downloaded: KV rows [0, length) of every attention layer, conv
// window and recurrent state of every GDN layer.
struct StateDump {
  int length = 0;
  std::vector<std::vector<uint8_t>> kv;
  std::vector<std::vector<float>> gdn;
  bool operator==(const StateDump&) const = default;
};

inline StateDump dump_state(Backend& be, const SequenceState& st) {
  StateDump d;
  d.length = st.length();
  auto bytes = [&](const Tensor& t) {
    std::vector<uint8_t> all(static_cast<size_t>(t.nbytes()));
    PD_ASSERT(be.download(all.data(), t).is_ok());
    all.resize(static_cast<size_t>(st.length() * t.cols) * dtype_size(t.dtype));
    return all;
  };
  auto floats = [&](const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    PD_ASSERT(be.download(v.data(), t).is_ok());
    return v;
  };
  for (size_t l = 0; l < st.spec().layers.size(); ++l) {
    const int li = static_cast<int>(l);
    if (st.spec().layers[l] == LayerType::kFullAttention) {
      d.kv.push_back(bytes(st.kv(li).k));
      d.kv.push_back(bytes(st.kv(li).v));
    } else {
      d.gdn.push_back(floats(st.gdn(li).conv));
      d.gdn.push_back(floats(st.gdn(li).recurrent));
    }
  }
  return d;
}

inline SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

inline SamplingParams seeded(float temperature, float top_p, uint64_t seed) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_p = top_p;
  p.seed = seed;
  return p;
}

}  // namespace pd::exactness
