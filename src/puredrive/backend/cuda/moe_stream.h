// The experts of a decode MoE block streamed through shared memory (moe_stream_up.cu, moe_stream_down.cu):
// bf16 router and experts; the gate/up kernel computes the router and the route itself.
#pragma once

#include <cuda_runtime.h>

#include "puredrive/backend/cuda/kernels.h"

namespace pd::cuda {

struct MoeStreamArgs {
  MoeLaunch m;  // out: the chunk's first output row
  const float* x = nullptr;
  int64_t xs = 0;
  int rows = 0;  // <= kMaxRows
  // The route, written by the gate/up kernel's router and read by the down kernel (moe.cu's scratch): router
  // logits [rows][experts], sel/wts [rows][top_k] ascending id, the used experts ascending and their count,
  // the shared-expert gate logits [rows].
  float* logits = nullptr;
  int* sel = nullptr;
  float* wts = nullptr;
  int* used = nullptr;
  int* count = nullptr;
  float* sg = nullptr;
  float* act = nullptr;   // [kMaxRows][top_k][inter]
  float* sact = nullptr;  // [kMaxRows][shared_inter]
  // Whether a spare warp runs the route's code on zero logits before pdl_wait (PD_WARM_ROUTE=0: not).
  int warm_route = 0;
  int tiles_per_sync = 1;  // affine experts: 1 or kTilesPerSync (launch_moe_stream_*; PD_STREAM_PAIRS=0: 1)
  int evict_first = 0;     // the weight copies' L2 policy (MmaTargets::evict_first)
  // Whether the gate/up kernel's producers prefetch the used experts' down weights into L2 after their last
  // copy (PD_MOE_PREFETCH=0: not).
  int prefetch_down = 0;
};

// Whether the block takes this path: bf16 router, shared gate and experts, the shared expert of the routed
// experts' width, hidden size 512-4096 (a power of two), intermediate size 512, top-k <= 16, 16-byte
// aligned matrices (PD_MOE_STREAM=0 turns it off, for comparisons). Depends on the model only, never on the
// step's rows.
bool moe_stream_supported(const MoeLaunch& m);
// The route, then act/sact = silu(x Wg^T) * (x Wu^T) for every (row, selected expert) and the shared expert.
void launch_moe_stream_up(const MoeStreamArgs& a, cudaStream_t stream);
// out (=|+=) the combine of the experts' down products (moe.cu's order).
void launch_moe_stream_down(const MoeStreamArgs& a, cudaStream_t stream);

}  // namespace pd::cuda
