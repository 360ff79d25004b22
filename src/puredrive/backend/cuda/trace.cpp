// The ring of trace.cuh's records, its window and its dump at exit (builds with -DPD_KERNEL_TRACE=ON only).
#include "puredrive/backend/cuda/trace.cuh"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "puredrive/backend/cuda/cuda_backend.h"

namespace pd {

#ifdef PD_KERNEL_TRACE
namespace cuda::trace {
namespace {
Buffer g_buffer;

void dump() {
  unsigned long long next = 0;
  if (cudaDeviceSynchronize() != cudaSuccess ||
      cudaMemcpy(&next, g_buffer.next, sizeof next, cudaMemcpyDeviceToHost) != cudaSuccess) {
    std::fprintf(stderr, "trace: could not read the ring\n");
    return;
  }
  const uint64_t n = next < kCapacity ? next : kCapacity;
  std::vector<Record> rec(n);
  cudaMemcpy(rec.data(), g_buffer.rec, n * sizeof(Record), cudaMemcpyDeviceToHost);
  const char* path = std::getenv("PD_TRACE_FILE");
  if (path == nullptr) path = "pd_trace.bin";
  std::FILE* f = std::fopen(path, "wb");
  if (f == nullptr) return;
  std::fwrite(rec.data(), sizeof(Record), n, f);
  std::fclose(f);
  std::fprintf(stderr, "trace: %llu records (%llu written) to %s\n", next, static_cast<unsigned long long>(n),
               path);
}
}  // namespace

Buffer host_buffer() {
  if (g_buffer.rec == nullptr) {
    cudaMalloc(&g_buffer.rec, kCapacity * sizeof(Record));
    cudaMalloc(&g_buffer.next, sizeof(unsigned long long));
    cudaMalloc(&g_buffer.enabled, sizeof(int));
    cudaMemset(g_buffer.next, 0, sizeof(unsigned long long));
    cudaMemset(g_buffer.enabled, 0, sizeof(int));
    std::atexit(dump);
  }
  return g_buffer;
}
}  // namespace cuda::trace

void cuda_trace_window(bool open) {
  const cuda::trace::Buffer b = cuda::trace::host_buffer();
  const int on = open ? 1 : 0;
  // The launches before the switch finish under the old setting. The ring is not reset: a window's records
  // follow the previous window's (it starts empty, host_buffer).
  cudaDeviceSynchronize();
  cudaMemcpy(b.enabled, &on, sizeof on, cudaMemcpyHostToDevice);
}
#else
namespace cuda::trace {
Buffer host_buffer() {
  return {};
}
}  // namespace cuda::trace

void cuda_trace_window(bool) {}
#endif

}  // namespace pd
