// The CUDA backend (sm_90): weights uploaded once, every op on the device, row-exact kernels (kernels.h), and
// step capture: the ops between Backend::begin_step() and end_step() are recorded on the host and run at
// end_step() as one CUDA graph, captured the first time a step with those exact arguments is seen and
// replayed afterwards (set PD_CUDA_GRAPHS=0 to run recorded steps eagerly instead).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "puredrive/backend/backend.h"

namespace pd {

Expected<std::unique_ptr<Backend>> make_cuda_backend(const BackendOptions& options);

struct CudaDeviceInfo {
  std::string name;
  int compute_major = 0, compute_minor = 0;
  int multiprocessors = 0;
  int64_t total_memory = 0;
  int driver_version = 0;   // cudaDriverGetVersion, e.g. 13000
  int runtime_version = 0;  // cudaRuntimeGetVersion
};

struct CudaStepStats {
  int64_t graphs_captured = 0;
  int64_t graph_replays = 0;
  int64_t eager_steps = 0;  // steps run without a graph (graphs off, a download inside, or a buffer grew)
  int64_t last_graph_nodes = 0;  // kernel/memcpy nodes of the most recently captured graph
  int64_t cached_graphs = 0;
  // Where a recorded step's time goes: host time from begin_step() to end_step() (the model's op calls,
  // validation, recording), and device time of the graph (events around the launch; read at the next step).
  int64_t recorded_steps = 0;
  double record_seconds = 0;
  int64_t timed_graphs = 0;
  double graph_seconds = 0;
  // Times the host waited for the device: download(), synchronize(), upload() outside a step, a
  // begin_step() whose previous step was still running (its staged uploads are reused), and a copy_many()
  // with host destinations or whose pinned buffers were all still in use (cuda/copy_runner.h).
  int64_t host_waits = 0;
  // Host time in end_step() launching the step (graph lookup, recording when new, launch), and blocked in
  // download() and begin_step() waiting for the device.
  double launch_seconds = 0;
  double wait_seconds = 0;
};

// Device time of ops run eagerly while profiling is on (events around each op, a synchronisation after each:
// for finding where a step's time goes, not for throughput). Label: op kind, with the weight shape for
// matmul.
struct CudaOpTime {
  std::string label;
  int64_t count = 0;
  double seconds = 0;
};

// nullopt / no effect when backend is not the CUDA backend.
std::optional<CudaDeviceInfo> cuda_device_info(const Backend& backend);
std::optional<CudaStepStats> cuda_step_stats(const Backend& backend);
void set_cuda_op_profiling(Backend& backend, bool on);
// Distinct routed experts read by the decode MoE kernels since the backend was made, summed over layers and
// steps (waits for queued work): the expert bytes a verify step must read depend on how its rows' selections
// overlap.
Expected<int64_t> cuda_moe_experts_read(Backend& backend);
// Runs steps wider than kMaxRows through the tiled CUDA-core kernels the tensor-core prefill kernels replaced
// (gemm_tiled.cu, moe.cu's wide path), and prefill steps of up to kMaxRows rows through the decode kernels:
// the reference for tests and for measuring the prefill kernels. Drops the cached graphs.
void set_cuda_reference_prefill(Backend& backend, bool on);
std::vector<CudaOpTime> cuda_op_profile(const Backend& backend);  // sorted by total time, largest first
// Builds with -DPD_KERNEL_TRACE=ON: the kernel timeline (trace.cuh) records only between open and close;
// each window's records follow the previous one's. A no-op in other builds.
void cuda_trace_window(bool open);

// An NVTX range around host code, so a profiler (ncu --nvtx --nvtx-include NAME/) can select the kernels
// launched inside it.
void cuda_range_push(const char* name);
void cuda_range_pop();

}  // namespace pd
