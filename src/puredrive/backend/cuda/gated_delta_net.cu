// Gated DeltaNet after the input projections (backend.h GatedDeltaNetArgs; spec §5), rows in order, per chunk
// of up to kGdnChunk rows: one launch of gdn_recurrent.cu's step (conv, recurrence with the per-row
// snapshots, gated norm). The prefill's chunked form is gdn_prefill.cu.
#include "puredrive/backend/cuda/common.cuh"

namespace pd::cuda {

void launch_gated_delta_net(const GdnLaunch& g, cudaStream_t stream) {
  for (int r0 = 0; r0 < g.rows; r0 += kGdnChunk) {
    launch_gdn_step(g, r0, g.rows - r0 < kGdnChunk ? g.rows - r0 : kGdnChunk, stream);
  }
}

}  // namespace pd::cuda
