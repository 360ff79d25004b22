// The sparse MoE block for steps wider than kMaxRows on the reference path (tiled CUDA-core products; the
// tensor-core path is moe_grouped.cu), in passes of up to kMoeWideRows rows: router and shared-gate logits;
// route per row with the decode route's arithmetic (launch_moe_route_rows); per expert the ascending list
// of (row, slot) entries that selected it; gate/up and down as tiled products over each expert's entries;
// the decode combine (launch_moe_combine). Each expert's weights are read once per kTileRows of its entries.
#include "puredrive/backend/cuda/common.cuh"
#include "puredrive/backend/cuda/scratch_carver.h"

namespace pd::cuda {
namespace {

constexpr int kMoeWideRows = 256;

struct MoeWide {
  float* logits;  // [kMoeWideRows][E]
  float* sg;      // [kMoeWideRows]
  int* sel;       // [kMoeWideRows][K], ascending expert id
  float* wts;     // [kMoeWideRows][K]
  float* act;     // [kMoeWideRows * K][I]
  float* sact;    // [kMoeWideRows][Is]
  float* y;       // [kMoeWideRows * K][H]
  float* ys;      // [kMoeWideRows][H]
  int* count;     // [E]: entries per expert
  int* list;      // [E][kMoeWideRows]: entry r * K + slot, ascending r
};

MoeWide carve_wide(void* base, int E, int K, int H, int I, int Is, int64_t* total) {
  ScratchCarver c(base);
  const int64_t B = kMoeWideRows;
  MoeWide w{};
  w.logits = c.take<float>(B * E);
  w.sg = c.take<float>(B);
  w.sel = c.take<int>(B * K);
  w.wts = c.take<float>(B * K);
  w.act = c.take<float>(B * K * I);
  w.sact = c.take<float>(B * Is);
  w.y = c.take<float>(B * K * H);
  w.ys = c.take<float>(B * H);
  w.count = c.take<int>(E);
  w.list = c.take<int>(int64_t{E} * B);
  if (total != nullptr) *total = c.bytes();
  return w;
}

// One thread per expert: its entries in ascending row order.
__global__ void moe_bucket_kernel(int E, int K, int rows, MoeWide w) {
  const int e = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (e >= E) return;
  int n = 0;
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < K; ++i) {
      if (w.sel[r * K + i] == e) w.list[static_cast<int64_t>(e) * kMoeWideRows + n++] = r * K + i;
    }
  }
  w.count[e] = n;
}

}  // namespace

int64_t moe_wide_scratch_bytes(int experts, int top_k, int hidden, int inter, int shared_inter) {
  int64_t total = 0;
  carve_wide(nullptr, experts, top_k, hidden, inter, shared_inter, &total);
  return total;
}

void launch_moe_wide(const MoeLaunch& m, cudaStream_t stream) {
  const MoeWide w = carve_wide(m.scratch, m.experts, m.top_k, m.hidden, m.inter, m.shared_inter, nullptr);
  for (int r0 = 0; r0 < m.rows; r0 += kMoeWideRows) {
    const int n = m.rows - r0 < kMoeWideRows ? m.rows - r0 : kMoeWideRows;
    const float* x = m.x + r0 * m.x_stride;
    TileJob j;
    j.x = x;
    j.xs = m.x_stride;
    j.rows = n;
    j.w = m.router;
    j.out = w.logits;
    j.os = m.experts;
    launch_tiled(j, 1, n, stream);
    j.w = m.shared_gate;
    j.out = w.sg;
    j.os = 1;
    launch_tiled(j, 1, n, stream);
    launch_moe_route_rows(m, n, w.logits, w.sel, w.wts, stream);
    moe_bucket_kernel<<<grid_for(m.experts, 128), 128, 0, stream>>>(m.experts, m.top_k, n, w);
    // Routed experts: gate/up into act[entry], then down into y[entry].
    const TileJob up{.w = m.gate,
                     .w2 = m.up,
                     .dual = true,
                     .x = x,
                     .xs = m.x_stride,
                     .list = w.list,
                     .list_stride = kMoeWideRows,
                     .list_div = m.top_k,
                     .count = w.count,
                     .out = w.act,
                     .os = m.inter};
    launch_tiled(up, m.experts, n, stream);
    const TileJob dn{.w = m.down,
                     .x = w.act,
                     .xs = m.inter,
                     .list = w.list,
                     .list_stride = kMoeWideRows,
                     .list_div = 1,
                     .count = w.count,
                     .out = w.y,
                     .os = m.hidden};
    launch_tiled(dn, m.experts, n, stream);
    // The shared expert over all rows.
    const TileJob su{.w = m.sh_gate,
                     .w2 = m.sh_up,
                     .dual = true,
                     .x = x,
                     .xs = m.x_stride,
                     .rows = n,
                     .out = w.sact,
                     .os = m.shared_inter};
    launch_tiled(su, 1, n, stream);
    const TileJob sd{
        .w = m.sh_down, .x = w.sact, .xs = m.shared_inter, .rows = n, .out = w.ys, .os = m.hidden};
    launch_tiled(sd, 1, n, stream);
    MoeLaunch chunk = m;
    chunk.out = m.out + r0 * m.out_stride;
    launch_moe_combine(chunk, n, w.y, w.wts, w.sg, w.ys, stream);
  }
}

}  // namespace pd::cuda
