// The CPU op kernels behind CpuBackend. Arguments arrive validated (cpu_backend.cpp) with weights resolved
// from their handles. Work is split over output elements with a fixed partition (ThreadPool::parallel_for),
// and each output element is computed entirely by one thread in an order that depends only on its own row,
// so results are bitwise independent of the number of rows and of threads.
#pragma once

#include <span>
#include <vector>

#include "puredrive/backend/backend.h"
#include "puredrive/checkpoint/weights.h"
#include "puredrive/util/thread_pool.h"

namespace pd::cpu {

struct BoundMoe {
  MoeWeights w;
  MoeSpec spec;
  int num_experts = 0;          // E
  int hidden = 0;               // H
  int intermediate = 0;         // I
  int shared_intermediate = 0;  // Is
};

struct GdnVectors {
  std::span<const float> conv1d;   // [C * Kc]
  std::span<const float> A_log;    // [Hv]
  std::span<const float> dt_bias;  // [Hv]
  std::span<const float> norm;     // [Dv]
};

// Where ops run: the pool, and the smallest job (in multiply-adds) worth waking its workers for.
struct Exec {
  ThreadPool* pool = nullptr;
  double min_parallel_work = 0;
};

// pool->parallel_for, or a plain call when the whole job (n items of about `work` multiply-adds each) is
// smaller than ex.min_parallel_work. Results never depend on the choice: each index is self-contained.
template <typename Fn>
void parallel_for(const Exec& ex, size_t n, double work, const Fn& fn) {
  if (static_cast<double>(n) * work < ex.min_parallel_work) {
    fn(size_t{0}, n);
  } else {
    ex.pool->parallel_for(n, fn);
  }
}

void embed(const Exec& pool, const Matrix& table, const Tensor& tokens, const Tensor& out);
void rms_norm(const Exec& pool, const Tensor& x, const float* weight, float eps, const Tensor& out);
void add(const Exec& pool, const Tensor& a, const Tensor& b, const Tensor& out);
void matmul(const Exec& pool, const Matrix& w, const Tensor& x, const Tensor& out, Accum accum);
void gated_attention(const Exec& pool, const GatedAttentionArgs& args, const float* q_norm,
                     const float* k_norm);
void gated_delta_net(const Exec& pool, const GatedDeltaNetArgs& args, const GdnVectors& v);
void moe(const Exec& pool, const BoundMoe& m, const Tensor& x, const Tensor& out, Accum accum);
void argmax(const Tensor& x, const Tensor& out);

// x * rsqrt(mean(x^2) + eps) * w for one row of n (shared by rms_norm, q/k norms and the MTP head).
void rms_norm_row(const float* x, const float* w, int64_t n, float eps, float* out);

// ---- Gated DeltaNet pieces shared by the recurrence (gated_delta_net.cpp) and the chunked prefill
// (gdn_chunked.cpp) ----
// x * rsqrt(sum(x^2) + 1e-6) (FLA / HF l2norm; the eps is fixed, not rms_norm_eps), then times `scale`.
void l2norm(const float* x, int64_t n, float scale, float* out);
// The gated RMSNorm of one head, norm before gate: out = (w * (o * rsqrt(mean(o^2) + eps))) * silu(z).
void gdn_gated_norm(const float* o, const float* z, const float* w, int dv, float eps, float* out);
// The prefill rows of gated_delta_net after the conv: conv_out [R, C] holds SiLU(conv) of every row; writes
// out and the recurrent state (the conv state is already updated).
void gdn_chunked(const Exec& pool, const GatedDeltaNetArgs& args, const GdnVectors& v, const float* conv_out);

}  // namespace pd::cpu
