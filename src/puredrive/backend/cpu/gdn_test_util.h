// Test-only: random Gated DeltaNet inputs and a driver that runs them through gated_delta_net on any backend,
// in pieces that each take the recurrence or the chunked prefill form (the CPU op tests and the CUDA tests).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <random>
#include <vector>

#include "puredrive/backend/backend.h"
#include "puredrive/backend/cpu/test_util.h"

namespace pd::test {

struct GdnCase {
  GdnDims dims;
  int64_t tokens = 0;
  int64_t channels() const {
    return 2 * int64_t{dims.num_k_heads} * dims.k_head_dim + int64_t{dims.num_v_heads} * dims.v_head_dim;
  }
  int64_t value_dim() const { return int64_t{dims.num_v_heads} * dims.v_head_dim; }
  int64_t state_size() const { return int64_t{dims.k_head_dim} * dims.v_head_dim; }
  std::vector<float> qkv, z, b, a, conv1d, A_log, dt_bias, norm;
};

// decay: about the mean of exp(A_log), the decay rate. 1 and more forget within a few tokens (the tiny
// coder's heads run at 4-12); 0.01 keeps most of a chunk's state, so the state carried between chunks
// matters.
inline GdnCase make_gdn_case(std::mt19937& rng, int64_t tokens, const GdnDims& dims, float decay) {
  GdnCase c;
  c.dims = dims;
  c.tokens = tokens;
  const int64_t C = c.channels(), hv = dims.num_v_heads;
  c.qkv = random_vector(rng, static_cast<size_t>(tokens * C));
  c.z = random_vector(rng, static_cast<size_t>(tokens * c.value_dim()));
  c.b = random_vector(rng, static_cast<size_t>(tokens * hv));
  c.a = random_vector(rng, static_cast<size_t>(tokens * hv));
  c.conv1d = random_vector(rng, static_cast<size_t>(C * dims.conv_kernel), 0.5f);
  c.A_log = random_vector(rng, static_cast<size_t>(hv), 0.5f);
  for (float& x : c.A_log) x += std::log(decay);
  c.dt_bias = random_vector(rng, static_cast<size_t>(hv), 0.5f);
  c.norm = random_vector(rng, static_cast<size_t>(dims.v_head_dim), 0.2f);
  for (float& x : c.norm) x += 1.0f;
  return c;
}

// One gated_delta_net call over the next `rows` tokens: the chunked prefill form or the recurrence.
struct GdnPiece {
  int64_t rows = 0;
  bool prefill = false;
};

inline std::vector<GdnPiece> gdn_pieces(std::initializer_list<int64_t> rows, bool prefill) {
  std::vector<GdnPiece> p;
  for (int64_t n : rows) p.push_back({.rows = n, .prefill = prefill});
  return p;
}

struct GdnRun {
  std::vector<float> out, conv, recurrent;                      // all rows; the final states
  std::vector<std::vector<float>> conv_after, recurrent_after;  // states after every snapshot row
};

// Runs the case's tokens from zero states in the given pieces, the first at position 0. Recurrence pieces of
// up to 8 rows keep per-row snapshots (as the model's verify steps do). record: each piece is one recorded
// backend step (begin_step / end_step).
inline GdnRun run_gdn(Backend& be, const GdnCase& c, const std::vector<GdnPiece>& pieces,
                      bool record = false) {
  const GdnDims& d = c.dims;
  const int64_t C = c.channels(), vd = c.value_dim(), st = c.state_size(), hv = d.num_v_heads;
  const VectorId conv1d = be.bind_vector(c.conv1d, "conv1d").value();
  const VectorId a_log = be.bind_vector(c.A_log, "A_log").value();
  const VectorId dt = be.bind_vector(c.dt_bias, "dt_bias").value();
  const VectorId norm = be.bind_vector(c.norm, "norm").value();
  Buffer qkv = device_tensor(be, DType::kF32, c.tokens, C, c.qkv);
  Buffer z = device_tensor(be, DType::kF32, c.tokens, vd, c.z);
  Buffer b = device_tensor(be, DType::kF32, c.tokens, hv, c.b);
  Buffer a = device_tensor(be, DType::kF32, c.tokens, hv, c.a);
  Buffer out = be.alloc(DType::kF32, c.tokens, vd).value();
  Buffer conv = be.alloc(DType::kF32, d.conv_kernel - 1, C).value();
  Buffer rec = be.alloc(DType::kF32, hv, st).value();
  Buffer sconv = be.alloc(DType::kF32, 8, (d.conv_kernel - 1) * C).value();
  Buffer srec = be.alloc(DType::kF32, 8, hv * st).value();
  GdnRun res;
  int64_t t0 = 0;
  for (const GdnPiece& p : pieces) {
    const int64_t n = p.rows;
    const bool snapshots = !p.prefill && n <= 8;
    GdnSnapshots snaps;
    if (snapshots) snaps = {.conv = sconv.tensor(), .recurrent = srec.tensor()};
    if (record) {
      EXPECT_TRUE(be.begin_step().is_ok());
    }
    const Status s = be.gated_delta_net({.dims = d,
                                         .qkv = qkv.row_slice(t0, n),
                                         .z = z.row_slice(t0, n),
                                         .b = b.row_slice(t0, n),
                                         .a = a.row_slice(t0, n),
                                         .conv1d = conv1d,
                                         .A_log = a_log,
                                         .dt_bias = dt,
                                         .norm = norm,
                                         .state = {.conv = conv.tensor(), .recurrent = rec.tensor()},
                                         .snapshots = snaps,
                                         .out = out.row_slice(t0, n),
                                         .prefill = p.prefill,
                                         .position = static_cast<int32_t>(t0)});
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    if (record) {
      EXPECT_TRUE(be.end_step().is_ok());
    }
    for (int64_t r = 0; r < n && snapshots; ++r) {
      res.conv_after.push_back(to_host(be, sconv.row_slice(r, 1)));
      res.recurrent_after.push_back(to_host(be, srec.row_slice(r, 1)));
    }
    t0 += n;
  }
  EXPECT_EQ(t0, c.tokens) << "the pieces do not cover the case's tokens";
  res.out = to_host(be, out.tensor());
  res.conv = to_host(be, conv.tensor());
  res.recurrent = to_host(be, rec.tensor());
  return res;
}

}  // namespace pd::test
