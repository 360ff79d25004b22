// The sparse MoE block (spec §6; HF Qwen3_5MoeSparseMoeBlock with the eager experts implementation).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "puredrive/backend/cpu/cpu_ops.h"
#include "puredrive/backend/cpu/kernels.h"

namespace pd::cpu {
namespace {

struct Route {
  int expert;
  float weight;
};

// fp32 softmax over all experts, top-k (ties to the lower id), renormalised when norm_topk_prob; returned in
// ascending expert id, the order in which HF's index_add_ loop accumulates.
std::vector<Route> route(const float* logits, int num_experts, const MoeSpec& spec) {
  std::vector<float> p(static_cast<size_t>(num_experts));
  float mx = logits[0];
  for (int e = 1; e < num_experts; ++e) mx = std::max(mx, logits[e]);
  float sum = 0.0f;
  for (int e = 0; e < num_experts; ++e) {
    p[static_cast<size_t>(e)] = std::exp(logits[e] - mx);
    sum += p[static_cast<size_t>(e)];
  }
  for (float& x : p) x = x / sum;

  std::vector<int> order(static_cast<size_t>(num_experts));
  std::iota(order.begin(), order.end(), 0);
  const int k = spec.num_experts_per_tok;
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int x, int y) {
    const float px = p[static_cast<size_t>(x)];
    const float py = p[static_cast<size_t>(y)];
    return px > py || (px == py && x < y);
  });
  std::vector<Route> routes(static_cast<size_t>(k));
  float top_sum = 0.0f;
  for (int i = 0; i < k; ++i) top_sum += p[static_cast<size_t>(order[static_cast<size_t>(i)])];
  for (int i = 0; i < k; ++i) {
    const int e = order[static_cast<size_t>(i)];
    const float w = p[static_cast<size_t>(e)];
    routes[static_cast<size_t>(i)] = {e, spec.norm_topk_prob ? w / top_sum : w};
  }
  std::sort(routes.begin(), routes.end(), [](const Route& x, const Route& y) { return x.expert < y.expert; });
  return routes;
}

}  // namespace

void moe(const Exec& pool, const BoundMoe& m, const Tensor& x, const Tensor& out, Accum accum) {
  const int64_t rows = x.rows;
  const int num_experts = m.num_experts;
  const int k = m.spec.num_experts_per_tok;
  const int64_t hidden = m.hidden;
  const int64_t inter = m.intermediate;
  const int64_t shared_inter = m.shared_intermediate;

  // Router and shared-expert gate logits.
  std::vector<float> logits(static_cast<size_t>(rows * num_experts));
  std::vector<float> shared_logit(static_cast<size_t>(rows));
  const Tensor logits_t{.data = logits.data(), .rows = rows, .cols = num_experts, .stride = num_experts};
  const Tensor shared_t{.data = shared_logit.data(), .rows = rows, .cols = 1, .stride = 1};
  matmul(pool, m.w.gate, x, logits_t, Accum::kOverwrite);
  matmul(pool, m.w.shared_expert_gate, x, shared_t, Accum::kOverwrite);

  // Selected (row, slot) pairs per expert, experts ascending; slot = r * k + i indexes the activations.
  std::vector<std::vector<Route>> routes(static_cast<size_t>(rows));
  std::vector<std::vector<int64_t>> users(static_cast<size_t>(num_experts));
  for (int64_t r = 0; r < rows; ++r) {
    routes[static_cast<size_t>(r)] = route(logits.data() + r * num_experts, num_experts, m.spec);
    for (int i = 0; i < k; ++i)
      users[static_cast<size_t>(routes[static_cast<size_t>(r)][static_cast<size_t>(i)].expert)].push_back(
          r * k + i);
  }
  std::vector<int> used;
  for (int e = 0; e < num_experts; ++e) {
    if (!users[static_cast<size_t>(e)].empty()) used.push_back(e);
  }

  // Phase A: act = silu(x W_gate^T) * (x W_up^T) for every selected (row, expert) and for the shared expert.
  // One work item per block of an expert's output rows: its gate and up rows are dequantised once for all
  // rows using it.
  std::vector<float> act(static_cast<size_t>(rows * k * inter));
  std::vector<float> shared_act(static_cast<size_t>(rows * shared_inter));
  const int nb = dot_block_rows(rows);
  const int64_t expert_blocks = (inter + nb - 1) / nb;
  const int64_t routed_items = static_cast<int64_t>(used.size()) * expert_blocks;
  const int64_t shared_items = (shared_inter + nb - 1) / nb;
  std::vector<const float*> xs(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) xs[static_cast<size_t>(r)] = x.row<float>(r);
  parallel_for(
      pool, static_cast<size_t>(routed_items + shared_items), 2.0 * static_cast<double>(hidden * nb),
      [&](size_t begin, size_t end) {
        std::vector<float> buf(static_cast<size_t>(hidden * nb));
        std::vector<const float*> in(static_cast<size_t>(rows * k));
        std::vector<float> g(static_cast<size_t>(rows * k * nb)), u(g.size());
        // act rows dst(i) (i < cnt) from the gate and up dots of output rows n0 .. n0 + count - 1.
        auto gate_up = [&](const Matrix& wg, const Matrix& wu, int64_t n0, int64_t width,
                           const float* const* src, int64_t cnt, auto dst) {
          const int count = static_cast<int>(std::min<int64_t>(nb, width - n0));
          dot_block(wg, n0, count, src, cnt, g.data(), buf.data());
          dot_block(wu, n0, count, src, cnt, u.data(), buf.data());
          for (int64_t i = 0; i < cnt; ++i) {
            float* a = dst(i) + n0;
            for (int j = 0; j < count; ++j) {
              const size_t at = static_cast<size_t>(j * cnt + i);
              a[j] = silu(g[at]) * u[at];
            }
          }
        };
        for (size_t it = begin; it < end; ++it) {
          const int64_t item = static_cast<int64_t>(it);
          if (item < routed_items) {
            const int e = used[static_cast<size_t>(item / expert_blocks)];
            const std::vector<int64_t>& slots = users[static_cast<size_t>(e)];
            const int64_t cnt = static_cast<int64_t>(slots.size());
            for (int64_t i = 0; i < cnt; ++i)
              in[static_cast<size_t>(i)] = xs[static_cast<size_t>(slots[static_cast<size_t>(i)] / k)];
            gate_up(m.w.gate_proj[static_cast<size_t>(e)], m.w.up_proj[static_cast<size_t>(e)],
                    (item % expert_blocks) * nb, inter, in.data(), cnt,
                    [&](int64_t i) { return act.data() + slots[static_cast<size_t>(i)] * inter; });
          } else {
            gate_up(m.w.shared_gate_proj, m.w.shared_up_proj, (item - routed_items) * nb, shared_inter,
                    xs.data(), rows, [&](int64_t r) { return shared_act.data() + r * shared_inter; });
          }
        }
      });

  // Phase B, per output element: routed experts summed in ascending id, then the gated shared expert. One
  // work item per block of output rows, so that a prefill step's activations are read once per block.
  std::vector<const float*> shared_in(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) shared_in[static_cast<size_t>(r)] = shared_act.data() + r * shared_inter;
  const double down_work = static_cast<double>(rows * (k * inter + shared_inter) * nb);
  const int64_t out_blocks = (hidden + nb - 1) / nb;
  parallel_for(pool, static_cast<size_t>(out_blocks), down_work, [&](size_t begin, size_t end) {
    std::vector<float> buf(static_cast<size_t>(std::max(inter, shared_inter) * nb));
    std::vector<float> acc(static_cast<size_t>(rows * nb)), y(static_cast<size_t>(rows * k * nb));
    std::vector<const float*> in(static_cast<size_t>(rows * k));
    for (size_t bb = begin; bb < end; ++bb) {
      const int64_t n0 = static_cast<int64_t>(bb) * nb;
      const int count = static_cast<int>(std::min<int64_t>(nb, hidden - n0));
      std::fill(acc.begin(), acc.end(), 0.0f);  // acc[j * rows + r]: output n0 + j of row r
      for (int e : used) {
        const std::vector<int64_t>& slots = users[static_cast<size_t>(e)];
        const int64_t cnt = static_cast<int64_t>(slots.size());
        for (int64_t i = 0; i < cnt; ++i)
          in[static_cast<size_t>(i)] = act.data() + slots[static_cast<size_t>(i)] * inter;
        dot_block(m.w.down_proj[static_cast<size_t>(e)], n0, count, in.data(), cnt, y.data(), buf.data());
        for (int j = 0; j < count; ++j) {
          for (int64_t i = 0; i < cnt; ++i) {
            const int64_t slot = slots[static_cast<size_t>(i)];
            const int64_t r = slot / k;
            const float weight = routes[static_cast<size_t>(r)][static_cast<size_t>(slot % k)].weight;
            float& a = acc[static_cast<size_t>(j * rows + r)];
            a = a + y[static_cast<size_t>(j * cnt + i)] * weight;
          }
        }
      }
      dot_block(m.w.shared_down_proj, n0, count, shared_in.data(), rows, y.data(), buf.data());
      for (int64_t r = 0; r < rows; ++r) {
        const float gate = sigmoid(shared_logit[static_cast<size_t>(r)]);
        float* o = out.row<float>(r) + n0;
        for (int j = 0; j < count; ++j) {
          const float v =
              acc[static_cast<size_t>(j * rows + r)] + gate * y[static_cast<size_t>(j * rows + r)];
          o[j] = accum == Accum::kAdd ? o[j] + v : v;
        }
      }
    }
  });
}

}  // namespace pd::cpu
