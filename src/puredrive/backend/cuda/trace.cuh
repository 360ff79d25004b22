// A timeline of the decode step's kernels, for builds configured with -DPD_KERNEL_TRACE=ON only (the device
// has no Nsight Systems, and ncu serialises kernels, so neither shows how the graph's launches overlap).
//
// Thread 0 of every block of a traced kernel writes one record: the launch (%gridid), the block's start and
// end on the global timer, its SM, and up to six phase stamps in SM cycles since its start. Records go to a
// ring in device memory; at exit the ring is written to $PD_TRACE_FILE (bench/device/trace_summary.py reads
// it). Only launches inside a window (cuda_trace_window, cuda_backend.h) are recorded. Without the option
// every macro expands to nothing and the kernels are unchanged.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pd::cuda::trace {

enum Kernel : uint32_t {
  kEmbed = 1,
  kRmsNorm,
  kGemvStream,
  kGemvStreamAffine,
  kMoeUp,
  kMoeDown,
  kGdnConv,       // no longer launched (the conv runs in the GDN step); kept so that kinds keep their numbers
  kGdnRecurrent,  // the GDN step (conv, recurrence, gated norm)
  kQkNormRope,
  kAttnDecode,
  kAttnMerge,
  kArgmaxSlices,
  kArgmaxMerge,
};

struct Record {
  uint64_t grid;
  uint64_t t0, t1;  // ns, global timer
  uint32_t kernel, block, smid, rows;
  uint32_t stamp[14];  // SM cycles since the block's start (0: not reached); stamp[13]: its end
};
static_assert(sizeof(Record) == 96);
constexpr int kStamps = 13;

struct Buffer {
  Record* rec = nullptr;
  unsigned long long* next = nullptr;
  int* enabled = nullptr;  // records are written only while a window is open (cuda_trace_window)
};
constexpr uint64_t kCapacity = uint64_t{1} << 22;

// The ring (allocated once; its dump registered at exit).
Buffer host_buffer();

}  // namespace pd::cuda::trace

#if defined(PD_KERNEL_TRACE) && defined(__CUDACC__)
namespace {
// Per translation unit: each .cu file's kernels see their own copy of the pointers.
__device__ pd::cuda::trace::Buffer pd_trace_buf;

[[maybe_unused]] void pd_trace_ensure() {
  static const bool done = [] {
    const pd::cuda::trace::Buffer b = pd::cuda::trace::host_buffer();
    cudaMemcpyToSymbol(pd_trace_buf, &b, sizeof b);
    return true;
  }();
  (void)done;
}

__device__ __forceinline__ uint64_t pd_trace_now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ long long pd_trace_clock() {
  long long c;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c));
  return c;
}

// Writes the block's record when thread 0 leaves the kernel's scope (early returns included).
struct PdTraceScope {
  uint64_t t0;
  long long c0;
  uint32_t kernel, rows;
  uint32_t stamp[pd::cuda::trace::kStamps] = {};
  __device__ PdTraceScope(uint32_t k, uint32_t r)
      : t0(pd_trace_now()), c0(pd_trace_clock()), kernel(k), rows(r) {}
  __device__ void mark(int i) { stamp[i] = static_cast<uint32_t>(pd_trace_clock() - c0); }
  __device__ ~PdTraceScope() {
    if (threadIdx.x != 0 || pd_trace_buf.rec == nullptr || *pd_trace_buf.enabled == 0) return;
    pd::cuda::trace::Record r;
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(r.grid));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(r.smid));
    r.t0 = t0;
    r.t1 = pd_trace_now();
    r.kernel = kernel;
    r.block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    r.rows = rows;
    for (int i = 0; i < pd::cuda::trace::kStamps; ++i) r.stamp[i] = stamp[i];
    r.stamp[pd::cuda::trace::kStamps] = static_cast<uint32_t>(pd_trace_clock() - c0);
    const unsigned long long i = atomicAdd(pd_trace_buf.next, 1ull) % pd::cuda::trace::kCapacity;
    pd_trace_buf.rec[i] = r;
  }
};
// Clock readings of any one thread of the block (PD_TRACE_CLK), taken into thread 0's record by
// PD_TRACE_ADOPT.
__shared__ long long pd_trace_clk[pd::cuda::trace::kStamps];
}  // namespace

#define PD_TRACE_ENSURE() pd_trace_ensure()
#define PD_TRACE_CLK(i) (pd_trace_clk[i] = pd_trace_clock())
#define PD_TRACE_CLEAR()                                                       \
  do {                                                                         \
    if (threadIdx.x < pd::cuda::trace::kStamps) pd_trace_clk[threadIdx.x] = 0; \
  } while (0)
#define PD_TRACE_ADOPT(i)                                                     \
  do {                                                                        \
    if (threadIdx.x == 0 && pd_trace_clk[i] != 0)                             \
      pd_span.stamp[i] = static_cast<uint32_t>(pd_trace_clk[i] - pd_span.c0); \
  } while (0)
#define PD_TRACE_SCOPE(kernel, rows) \
  PdTraceScope pd_span(pd::cuda::trace::kernel, static_cast<uint32_t>(rows))
#define PD_TRACE_STAMP(i) pd_span.mark(i)
#else
#define PD_TRACE_ENSURE() ((void)0)
#define PD_TRACE_SCOPE(kernel, rows) ((void)0)
#define PD_TRACE_STAMP(i) ((void)0)
#define PD_TRACE_CLK(i) ((void)0)
#define PD_TRACE_CLEAR() ((void)0)
#define PD_TRACE_ADOPT(i) ((void)0)
#endif
