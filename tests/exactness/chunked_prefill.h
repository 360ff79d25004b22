// Chunking invariance (docs/DESIGN.md §4.6), shared by the CPU test (tests/exactness) and the CUDA test
// (tests/cuda): a prompt prefilled in pieces must leave the same bits as in one piece.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "puredrive/model/model.h"
#include "puredrive/util/status.h"

namespace pd::test {

// What a prefill leaves behind: the last row's logits, then per layer the KV rows written (K, V) or the GDN
// conv window and recurrent state, as bytes.
struct PrefillResult {
  std::vector<float> logits;
  std::vector<std::vector<uint8_t>> state;
};

inline std::vector<uint8_t> tensor_bytes(Backend& be, const Tensor& t, int64_t rows) {
  std::vector<uint8_t> v(static_cast<size_t>(t.nbytes()));
  PD_ASSERT(be.download(v.data(), t).is_ok());
  v.resize(static_cast<size_t>(rows * t.cols) * dtype_size(t.dtype));
  return v;
}

// Prefills `tokens` from an empty state in pieces ending at `ends` (ascending, the last one tokens.size()),
// each a forward step with ForwardOptions::prefill; logits of the last row only.
inline PrefillResult chunked_prefill(Model& m, std::span<const int32_t> tokens, const std::vector<int>& ends,
                                     DType kv) {
  Expected<SequenceState> st_or =
      m.new_state({.ctx_size = static_cast<int>(tokens.size()) + 8, .kv_dtype = kv, .max_rows = 8});
  PD_ASSERT(st_or.has_value(), "{}", st_or.status().to_string());
  SequenceState& st = *st_or;
  Backend& be = m.backend();
  PrefillResult r;
  int begin = 0;
  for (const int end : ends) {
    std::vector<int32_t> pos(static_cast<size_t>(end - begin));
    for (int i = begin; i < end; ++i) pos[static_cast<size_t>(i - begin)] = i;
    const bool last = end == static_cast<int>(tokens.size());
    Expected<StepOutput> o =
        m.forward(st, tokens.subspan(static_cast<size_t>(begin), static_cast<size_t>(end - begin)), pos,
                  {.logits = last ? LogitRows::kLast : LogitRows::kNone, .tap = {}, .prefill = true});
    PD_ASSERT(o.has_value(), "{}", o.status().to_string());
    if (last) {
      r.logits.resize(static_cast<size_t>(o->logits.cols));
      PD_ASSERT(be.download(r.logits.data(), o->logits).is_ok());
    }
    begin = end;
  }
  const CacheSpec& spec = st.spec();
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    const int li = static_cast<int>(l);
    if (spec.layers[l] == LayerType::kFullAttention) {
      r.state.push_back(tensor_bytes(be, st.kv(li).k, st.length()));
      r.state.push_back(tensor_bytes(be, st.kv(li).v, st.length()));
    } else {
      r.state.push_back(tensor_bytes(be, st.gdn(li).conv, st.gdn(li).conv.rows));
      r.state.push_back(tensor_bytes(be, st.gdn(li).recurrent, st.gdn(li).recurrent.rows));
    }
  }
  return r;
}

// The splits the chunking tests use for a prompt of n > 256 tokens: whole, in 2 and in 5 pieces, every
// boundary a multiple of 64.
inline std::vector<std::vector<int>> chunk_splits(int n) {
  return {{n}, {192, n}, {64, 128, 192, 256, n}};
}

}  // namespace pd::test
