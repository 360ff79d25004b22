// Step recording and CUDA graphs of the CUDA backend: begin_step() / end_step(), submit(), the graph cache,
// the error plumbing, op scratch and staging buffers, and op profiling.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "puredrive/backend/cuda/cuda_backend_impl.h"

namespace pd::cuda_impl {

Status CudaBackend::begin_step() {
  if (step_depth_++ > 0) return Status::ok();
  uploader_->release();  // weights are bound before the first step: free the upload threads and buffers
  // Staging is reused by every step: the previous step's copies must have read it.
  const cudaError_t done = step_recorded_ ? cudaEventQuery(step_done_) : cudaSuccess;
  if (done == cudaErrorNotReady) {
    // Not an error: keep it from looking like a failed launch to the next cudaGetLastError().
    if (cudaPeekAtLastError() == cudaErrorNotReady) cudaGetLastError();
    ++stats_.host_waits;
    const auto w0 = std::chrono::steady_clock::now();
    PD_CUDA_TRY(cudaEventSynchronize(step_done_));
    stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  } else if (done != cudaSuccess) {
    return cuda_error(done, "cudaEventQuery");
  }
  if (graph_timed_) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, graph_start_, graph_end_) == cudaSuccess) {
      stats_.graph_seconds += ms * 1e-3;
      ++stats_.timed_graphs;
    }
    cudaGetLastError();
    graph_timed_ = false;
  }
  step_begin_time_ = std::chrono::steady_clock::now();
  staging_used_ = 0;
  sig_.start();
  pending_.clear();
  step_eager_ = false;
  step_moved_buffers_ = false;
  step_prefill_ = false;
  return Status::ok();
}

Status CudaBackend::end_step() {
  if (step_depth_ == 0) return make_error(ErrorCode::kInternal, "end_step without begin_step");
  if (--step_depth_ > 0) return Status::ok();
  stats_.record_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - step_begin_time_).count();
  ++stats_.recorded_steps;
  const auto l0 = std::chrono::steady_clock::now();
  Status st = run_pending();
  stats_.launch_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - l0).count();
  sig_.stop();
  if (step_eager_) ++stats_.eager_steps;
  step_eager_ = false;
  PD_CUDA_TRY(cudaEventRecord(step_done_, stream_));
  step_recorded_ = true;
  release_retired();
  PD_TRY(st);
  return take_error();
}

void CudaBackend::submit(Launch fn, const char* kind, int64_t rows, int64_t cols) {
  if (recording()) {
    pending_.push_back(std::move(fn));
    return;
  }
  if (profiling_) {
    cudaEventRecord(prof_start_, stream_);
    fn(stream_);
    note_error(cudaGetLastError(), "kernel launch");
    cudaEventRecord(prof_end_, stream_);
    cudaEventSynchronize(prof_end_);
    float ms = 0;
    cudaEventElapsedTime(&ms, prof_start_, prof_end_);
    CudaOpTime& t = profile_[rows > 0 ? fmt::format("{} [{}, {}]", kind, rows, cols) : std::string(kind)];
    ++t.count;
    t.seconds += ms * 1e-3;
    return;
  }
  fn(stream_);
  note_error(cudaGetLastError(), "kernel launch");
}

void CudaBackend::set_reference_prefill(bool on) {
  if (on == reference_prefill_) return;
  reference_prefill_ = on;
  clear_graphs();
}

void CudaBackend::set_profiling(bool on) {
  if (on && prof_start_ == nullptr) {
    cudaEventCreate(&prof_start_);
    cudaEventCreate(&prof_end_);
  }
  if (on) profile_.clear();
  profiling_ = on && prof_start_ != nullptr;
}

std::vector<CudaOpTime> CudaBackend::profile() const {
  std::vector<CudaOpTime> v;
  for (const auto& [label, t] : profile_) v.push_back({label, t.count, t.seconds});
  std::sort(v.begin(), v.end(),
            [](const CudaOpTime& a, const CudaOpTime& b) { return a.seconds > b.seconds; });
  return v;
}

Status CudaBackend::flush_for_host() {
  if (!recording()) return Status::ok();
  for (Launch& fn : pending_) {
    fn(stream_);
    note_error(cudaGetLastError(), "kernel launch");
  }
  pending_.clear();
  step_eager_ = true;
  sig_.stop();
  return Status::ok();
}

Status CudaBackend::run_pending() {
  if (pending_.empty()) return Status::ok();
  std::vector<Launch> ops = std::move(pending_);
  pending_.clear();
  // A prefill step's shape (its rows) rarely comes back: it runs eagerly the first time, and records a graph
  // only when seen again (a prompt of a new length would otherwise cost a recording and a cache entry).
  // PD_GRAPH_FIRST_SIGHT=1 (an experiment) treats every step so.
  bool first_prefill = false;
  if (graphs_enabled_ && (step_prefill_ || every_step_first_sight_)) {
    if (prefill_shapes_.size() >= kMaxGraphs * 8) prefill_shapes_.clear();
    first_prefill = prefill_shapes_.insert(std::hash<std::string>{}(sig_.bytes())).second &&
                    !graphs_.contains(sig_.bytes());
  }
  // Ops recorded before a scratch or staging buffer moved hold its old address, which is freed after this
  // step: such a graph must not be replayed, so the step runs eagerly (its next recording is cached).
  if (!graphs_enabled_ || step_moved_buffers_ || first_prefill) {
    for (Launch& fn : ops) {
      fn(stream_);
      note_error(cudaGetLastError(), "kernel launch");
    }
    step_eager_ = true;
    return take_error();
  }
  auto it = graphs_.find(sig_.bytes());
  if (it == graphs_.end()) {
    if (graphs_.size() >= kMaxGraphs) clear_graphs();
    // PD_GRAPH_SEGMENT=N (an experiment): graphs of at most N ops each, so that the GPU starts on the first
    // while the host still launches the next.
    const size_t per = graph_segment_ops_ > 0 ? static_cast<size_t>(graph_segment_ops_) : ops.size();
    GraphEntry entry;
    for (size_t first = 0; first < ops.size(); first += per) {
      const Status st = capture(std::span(ops).subspan(first, std::min(per, ops.size() - first)), &entry);
      if (!st.is_ok()) {
        for (cudaGraphExec_t x : entry.execs) cudaGraphExecDestroy(x);
        return st;
      }
    }
    stats_.last_graph_nodes = entry.nodes;
    ++stats_.graphs_captured;
    it = graphs_.emplace(sig_.bytes(), std::move(entry)).first;
  }
  PD_CUDA_TRY(cudaEventRecord(graph_start_, stream_));
  for (cudaGraphExec_t x : it->second.execs) PD_CUDA_TRY(cudaGraphLaunch(x, stream_));
  PD_CUDA_TRY(cudaEventRecord(graph_end_, stream_));
  graph_timed_ = true;
  ++stats_.graph_replays;
  return Status::ok();
}

Status CudaBackend::capture(std::span<Launch> ops, GraphEntry* entry) {
  PD_CUDA_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  for (Launch& fn : ops) {
    fn(stream_);
    note_error(cudaGetLastError(), "kernel launch during graph capture");
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t e = cudaStreamEndCapture(stream_, &graph);
  if (e != cudaSuccess || !sticky_.is_ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    Status s = take_error();
    return s.is_ok() ? cuda_error(e, "cudaStreamEndCapture") : s;
  }
  size_t nodes = 0;
  cudaGraphGetNodes(graph, nullptr, &nodes);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t ie = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (ie != cudaSuccess) return cuda_error(ie, "cudaGraphInstantiate");
  entry->execs.push_back(exec);
  entry->nodes += static_cast<int64_t>(nodes);
  return Status::ok();
}

void CudaBackend::clear_graphs() {
  for (auto& [key, g] : graphs_) {
    for (cudaGraphExec_t x : g.execs) cudaGraphExecDestroy(x);
  }
  graphs_.clear();
}

Expected<uint8_t*> CudaBackend::stage(size_t bytes) {
  const size_t need = round_up(static_cast<int64_t>(staging_used_ + bytes), 256);
  if (staging_ == nullptr || need > staging_bytes_) {
    if (staging_ != nullptr) retired_host_.push_back(staging_);
    staging_bytes_ = std::max<size_t>(need * 2, size_t{1} << 20);
    void* p = nullptr;
    PD_CUDA_TRY(cudaHostAlloc(&p, staging_bytes_, cudaHostAllocMapped));
    staging_ = static_cast<uint8_t*>(p);
    void* mapped = nullptr;
    PD_CUDA_TRY(cudaHostGetDevicePointer(&mapped, p, 0));
    staging_device_ = static_cast<uint8_t*>(mapped);
    staging_used_ = 0;
    clear_graphs();
    if (recording()) step_moved_buffers_ = true;
  }
  uint8_t* out = staging_ + staging_used_;
  staging_used_ = round_up(static_cast<int64_t>(staging_used_ + bytes), 16);
  return out;
}

Expected<void*> CudaBackend::scratch(Scratch& s, int64_t bytes) {
  if (bytes > s.bytes) {
    if (s.ptr != nullptr) retired_device_.push_back(s.ptr);
    s.ptr = nullptr;
    s.bytes = 0;
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, static_cast<size_t>(bytes));
    if (e != cudaSuccess) {
      cudaGetLastError();
      return make_error(ErrorCode::kOutOfMemory, "CUDA backend: cannot allocate {} bytes of op scratch: {}",
                        bytes, cudaGetErrorString(e));
    }
    s.ptr = p;
    s.bytes = bytes;
    clear_graphs();
    if (recording()) step_moved_buffers_ = true;
  }
  return s.ptr;
}

void CudaBackend::release_retired() {
  for (void* p : retired_device_) cudaFree(p);
  for (uint8_t* p : retired_host_) cudaFreeHost(p);
  retired_device_.clear();
  retired_host_.clear();
}

}  // namespace pd::cuda_impl
