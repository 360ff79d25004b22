// The CUDA backend's construction, device memory ops and the public functions of cuda_backend.h; the rest of
// the class is in the files cuda_backend_impl.h lists.
#include "puredrive/backend/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <fmt/format.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "puredrive/backend/cuda/cuda_backend_impl.h"

namespace pd {
namespace cuda_impl {

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  uploader_.reset();
  copier_.reset();
  clear_graphs();
  release_retired();
  for (void* p : weights_) cudaFree(p);
  for (Scratch* s : {&attn_scratch_, &gdn_scratch_, &moe_scratch_, &argmax_scratch_, &sample_scratch_}) {
    if (s->ptr != nullptr) cudaFree(s->ptr);
  }
  if (staging_ != nullptr) cudaFreeHost(staging_);
  if (experts_read_ != nullptr) cudaFree(experts_read_);
  if (router_ticket_ != nullptr) cudaFree(router_ticket_);
  if (step_done_ != nullptr) cudaEventDestroy(step_done_);
  if (graph_start_ != nullptr) cudaEventDestroy(graph_start_);
  if (graph_end_ != nullptr) cudaEventDestroy(graph_end_);
  if (prof_start_ != nullptr) cudaEventDestroy(prof_start_);
  if (prof_end_ != nullptr) cudaEventDestroy(prof_end_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

Status CudaBackend::init() {
  PD_CUDA_TRY(cudaSetDevice(device_));
  cudaDeviceProp prop{};
  PD_CUDA_TRY(cudaGetDeviceProperties(&prop, device_));
  info_.name = prop.name;
  info_.compute_major = prop.major;
  info_.compute_minor = prop.minor;
  info_.multiprocessors = prop.multiProcessorCount;
  info_.total_memory = static_cast<int64_t>(prop.totalGlobalMem);
  smem_optin_ = prop.sharedMemPerBlockOptin;
  PD_CUDA_TRY(cudaDriverGetVersion(&info_.driver_version));
  PD_CUDA_TRY(cudaRuntimeGetVersion(&info_.runtime_version));
  if (prop.major < 9) {
    return make_error(ErrorCode::kUnsupported,
                      "backend 'cuda': device {} ({}) has compute capability {}.{}; this build targets sm_90",
                      device_, prop.name, prop.major, prop.minor);
  }
  cuda::set_attention_smem_limit(smem_optin_);
  cuda::init_mma_kernels();
  cuda::set_gdn_prefill_smem_limit(smem_optin_);
  PD_CUDA_TRY(cudaGetLastError());
  PD_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  uploader_ = std::make_unique<cuda::WeightUploader>(device_, stream_);
  copier_ = std::make_unique<cuda::CopyRunner>(stream_);
  PD_CUDA_TRY(cudaEventCreateWithFlags(&step_done_, cudaEventDisableTiming));
  PD_CUDA_TRY(cudaEventCreate(&graph_start_));
  PD_CUDA_TRY(cudaEventCreate(&graph_end_));
  PD_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&experts_read_), sizeof(unsigned long long)));
  PD_CUDA_TRY(cudaMemset(experts_read_, 0, sizeof(unsigned long long)));
  PD_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&router_ticket_), 2 * sizeof(int)));
  PD_CUDA_TRY(cudaMemset(router_ticket_, 0, 2 * sizeof(int)));
  PD_CUDA_TRY(cudaDeviceSynchronize());
  const char* env = std::getenv("PD_CUDA_GRAPHS");
  graphs_enabled_ = env == nullptr || std::string(env) != "0";
  copy_kernels_ = cuda::env_switch_on("PD_COPY_KERNELS");
  every_step_first_sight_ = cuda::env_int("PD_GRAPH_FIRST_SIGHT", 0) == 1;
  graph_segment_ops_ = std::max(0, cuda::env_int("PD_GRAPH_SEGMENT", 0));
  return Status::ok();
}

Expected<int64_t> CudaBackend::experts_read() {
  PD_TRY(flush_for_host());
  unsigned long long v = 0;
  PD_CUDA_TRY(cudaMemcpy(&v, experts_read_, sizeof v, cudaMemcpyDeviceToHost));
  return static_cast<int64_t>(v);
}

std::string CudaBackend::name() const {
  return fmt::format("cuda ({}, sm_{}{}, {:.0f} GiB, graphs {})", info_.name, info_.compute_major,
                     info_.compute_minor, static_cast<double>(info_.total_memory) / (1 << 30),
                     graphs_enabled_ ? "on" : "off");
}

Expected<Buffer> CudaBackend::alloc(DType dtype, int64_t rows, int64_t cols) {
  PD_TRY(validate_alloc(rows, cols));
  const size_t bytes = static_cast<size_t>(rows * cols) * dtype_size(dtype);
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 256 : bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return make_error(ErrorCode::kOutOfMemory, "alloc: cannot allocate {} bytes ([{}, {}] {}) on the GPU: {}",
                      bytes, rows, cols, dtype_name(dtype), cudaGetErrorString(e));
  }
  PD_CUDA_TRY(cudaMemsetAsync(p, 0, bytes == 0 ? 256 : bytes, stream_));
  PD_CUDA_TRY(cudaStreamSynchronize(stream_));
  Tensor t{.data = p, .dtype = dtype, .rows = rows, .cols = cols, .stride = cols, .device = Device::kCuda};
  return Buffer(t, std::shared_ptr<void>(p, [](void* q) { cudaFree(q); }));
}

Status CudaBackend::upload(const Tensor& dst, const void* src) {
  PD_TRY(check_device("upload", dst));
  const size_t esize = dtype_size(dst.dtype);
  const size_t width = static_cast<size_t>(dst.cols) * esize;
  const size_t bytes = width * static_cast<size_t>(dst.rows);
  if (bytes == 0) return Status::ok();
  if (recording()) {
    // Copy the host data now into pinned staging; the recorded copy (a graph node) reads it at replay, as a
    // kernel reading the mapped staging over the bus.
    PD_ASSIGN_OR_RETURN(uint8_t * staged, stage(bytes));
    std::memcpy(staged, src, bytes);
    sig_.add(OpTag::kUpload);
    sig_.add(dst);
    sig_.add(reinterpret_cast<uintptr_t>(staged));
    const Tensor d = dst;
    const uint8_t* mapped = staging_device_ + (staged - staging_);
    const bool kernels = copy_kernels_;
    submit(
        [d, staged, mapped, width, esize, kernels](cudaStream_t s) {
          const auto pitch = static_cast<int64_t>(d.stride * esize);
          if (kernels) {
            cuda::launch_copy_rows(d.data, pitch, mapped, static_cast<int64_t>(width),
                                   static_cast<int64_t>(width), d.rows, s);
            return;
          }
          cudaMemcpy2DAsync(d.data, static_cast<size_t>(pitch), staged, width, width,
                            static_cast<size_t>(d.rows), cudaMemcpyHostToDevice, s);
        },
        "upload");
    return Status::ok();
  }
  PD_CUDA_TRY(cudaMemcpy2DAsync(dst.data, static_cast<size_t>(dst.stride) * esize, src, width, width,
                                static_cast<size_t>(dst.rows), cudaMemcpyHostToDevice, stream_));
  ++stats_.host_waits;
  PD_CUDA_TRY(cudaStreamSynchronize(stream_));
  return take_error();
}

Status CudaBackend::download(void* dst, const Tensor& src) {
  PD_TRY(check_device("download", src));
  PD_TRY(flush_for_host());
  const size_t esize = dtype_size(src.dtype);
  const size_t width = static_cast<size_t>(src.cols) * esize;
  if (width * static_cast<size_t>(src.rows) == 0) return take_error();
  PD_CUDA_TRY(cudaMemcpy2DAsync(dst, width, src.data, static_cast<size_t>(src.stride) * esize, width,
                                static_cast<size_t>(src.rows), cudaMemcpyDeviceToHost, stream_));
  ++stats_.host_waits;
  const auto w0 = std::chrono::steady_clock::now();
  PD_CUDA_TRY(cudaStreamSynchronize(stream_));
  stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  if (!recording()) release_retired();
  return take_error();
}

Status CudaBackend::copy(const Tensor& dst, const Tensor& src) {
  PD_TRY(validate_copy(dst, src));
  PD_TRY(check_device("copy", dst));
  PD_TRY(check_device("copy", src));
  sig_.add(OpTag::kCopy);
  sig_.add(dst);
  sig_.add(src);
  const bool kernels = copy_kernels_;
  submit(
      [dst, src, kernels](cudaStream_t s) {
        const size_t esize = dtype_size(src.dtype);
        if (kernels) {
          const bool flat = dst.contiguous() && src.contiguous();
          cuda::launch_copy_rows(dst.data, static_cast<int64_t>(dst.stride * esize), src.data,
                                 static_cast<int64_t>(src.stride * esize),
                                 flat ? src.nbytes() : static_cast<int64_t>(src.cols * esize),
                                 flat ? 1 : src.rows, s);
          return;
        }
        if (dst.contiguous() && src.contiguous()) {  // 1-D: no pitch limit
          cudaMemcpyAsync(dst.data, src.data, static_cast<size_t>(src.nbytes()), cudaMemcpyDeviceToDevice, s);
          return;
        }
        cudaMemcpy2DAsync(dst.data, static_cast<size_t>(dst.stride) * esize, src.data,
                          static_cast<size_t>(src.stride) * esize, static_cast<size_t>(src.cols) * esize,
                          static_cast<size_t>(src.rows), cudaMemcpyDeviceToDevice, s);
      },
      "copy");
  return take_error_if_eager();
}

Status CudaBackend::fill_zero(const Tensor& dst) {
  PD_TRY(check_device("fill_zero", dst));
  sig_.add(OpTag::kFillZero);
  sig_.add(dst);
  const bool kernels = copy_kernels_;
  submit(
      [dst, kernels](cudaStream_t s) {
        const size_t esize = dtype_size(dst.dtype);
        if (kernels) {
          const bool flat = dst.contiguous();
          cuda::launch_zero_rows(dst.data, static_cast<int64_t>(dst.stride * esize),
                                 flat ? dst.nbytes() : static_cast<int64_t>(dst.cols * esize),
                                 flat ? 1 : dst.rows, s);
          return;
        }
        if (dst.contiguous()) {
          cudaMemsetAsync(dst.data, 0, static_cast<size_t>(dst.nbytes()), s);
          return;
        }
        cudaMemset2DAsync(dst.data, static_cast<size_t>(dst.stride) * esize, 0,
                          static_cast<size_t>(dst.cols) * esize, static_cast<size_t>(dst.rows), s);
      },
      "fill_zero");
  return take_error_if_eager();
}

// One launch per round of copy_plan.h; a region between two host tensors is a memcpy here. Inside a recorded
// step, a list between device tensors is one kernel of the step (a rollback's GDN states): its piece table
// goes into the step's mapped staging, so that the step's graph replays it.
Status CudaBackend::copy_many(std::span<const CopyRegion> regions) {
  PD_TRY(validate_copy_many(Device::kCuda, regions));
  const bool device_only = std::all_of(regions.begin(), regions.end(), [](const CopyRegion& r) {
    return r.dst.device == Device::kCuda && r.src.device == Device::kCuda;
  });
  if (recording() && device_only) return record_copy_many(regions);
  PD_TRY(flush_for_host());
  std::vector<cuda::CopySpan> spans;
  spans.reserve(regions.size());
  for (const CopyRegion& r : regions) {
    cuda::CopySpan sp{.dst = static_cast<uint8_t*>(r.dst.data) + r.dst_offset,
                      .src = static_cast<const uint8_t*>(r.src.data) + r.src_offset,
                      .bytes = r.bytes,
                      .dst_host = r.dst.device == Device::kCpu,
                      .src_host = r.src.device == Device::kCpu};
    if (sp.dst_host && sp.src_host) {
      std::memcpy(sp.dst, sp.src, static_cast<size_t>(sp.bytes));
    } else if (sp.bytes > 0) {
      spans.push_back(sp);
    }
  }
  PD_TRY(copier_->run(spans, stats_.host_waits));
  return take_error();
}

Status CudaBackend::record_copy_many(std::span<const CopyRegion> regions) {
  std::vector<cuda::CopySpan> spans;
  spans.reserve(regions.size());
  for (const CopyRegion& r : regions) {
    if (r.bytes == 0) continue;
    spans.push_back({.dst = static_cast<uint8_t*>(r.dst.data) + r.dst_offset,
                     .src = static_cast<const uint8_t*>(r.src.data) + r.src_offset,
                     .bytes = r.bytes});
  }
  if (spans.empty()) return Status::ok();
  const std::vector<cuda::CopyRound> rounds = cuda::plan_copies(spans);
  if (rounds.size() != 1) return make_error(ErrorCode::kInternal, "copy_many: {} rounds", rounds.size());
  const cuda::CopyRound& round = rounds[0];
  PD_ASSIGN_OR_RETURN(uint8_t * table, stage(static_cast<size_t>(round.pinned_bytes())));
  uint8_t* mapped = staging_device_ + (table - staging_);
  round.write_table(table, mapped);
  // The pieces' addresses and sizes are not part of the step's shape: the kernel reads them from the table,
  // which every recording of the step writes again (a graph hit included) before the graph runs. So steps
  // that copy to or from a different place (the MTP head's pending rows) replay one graph.
  const auto count = static_cast<int64_t>(round.pieces.size());
  sig_.add(OpTag::kCopyMany);
  sig_.add(reinterpret_cast<uintptr_t>(table));
  sig_.add(count);
  submit(
      [mapped, count](cudaStream_t s) {
        cuda::launch_copy_pieces(reinterpret_cast<const cuda::CopyPiece*>(mapped), count, s);
      },
      "copy_many");
  return take_error_if_eager();
}

Status CudaBackend::synchronize() {
  PD_TRY(flush_for_host());
  ++stats_.host_waits;
  PD_CUDA_TRY(cudaStreamSynchronize(stream_));
  if (!recording()) release_retired();
  return take_error();
}

int64_t CudaBackend::available_memory() const {
  size_t free_bytes = 0, total = 0;
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) return 0;
  return static_cast<int64_t>(free_bytes);
}

}  // namespace cuda_impl

using cuda_impl::CudaBackend;

Expected<std::unique_ptr<Backend>> make_cuda_backend(const BackendOptions& options) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return make_error(ErrorCode::kUnsupported,
                      "backend 'cuda': no usable CUDA device ({}); use --backend cpu",
                      e != cudaSuccess ? fmt::format("{}: {}", cudaGetErrorName(e), cudaGetErrorString(e))
                                       : std::string("no devices found"));
  }
  if (options.device_index < 0 || options.device_index >= count) {
    return make_error(ErrorCode::kInvalidArgument, "backend 'cuda': device {} requested, {} present",
                      options.device_index, count);
  }
  auto b = std::make_unique<CudaBackend>(options.device_index);
  PD_TRY(b->init());
  return std::unique_ptr<Backend>(std::move(b));
}

std::optional<CudaDeviceInfo> cuda_device_info(const Backend& backend) {
  const auto* b = dynamic_cast<const CudaBackend*>(&backend);
  if (b == nullptr) return std::nullopt;
  return b->info();
}

Expected<int64_t> cuda_moe_experts_read(Backend& backend) {
  auto* b = dynamic_cast<CudaBackend*>(&backend);
  if (b == nullptr) return make_error(ErrorCode::kUnsupported, "not the CUDA backend");
  return b->experts_read();
}

std::optional<CudaStepStats> cuda_step_stats(const Backend& backend) {
  const auto* b = dynamic_cast<const CudaBackend*>(&backend);
  if (b == nullptr) return std::nullopt;
  return b->stats();
}

void set_cuda_reference_prefill(Backend& backend, bool on) {
  if (auto* b = dynamic_cast<CudaBackend*>(&backend)) b->set_reference_prefill(on);
}

void set_cuda_op_profiling(Backend& backend, bool on) {
  if (auto* b = dynamic_cast<CudaBackend*>(&backend)) b->set_profiling(on);
}

std::vector<CudaOpTime> cuda_op_profile(const Backend& backend) {
  const auto* b = dynamic_cast<const CudaBackend*>(&backend);
  return b == nullptr ? std::vector<CudaOpTime>{} : b->profile();
}

void cuda_range_push(const char* name) {
  nvtxRangePushA(name);
}

void cuda_range_pop() {
  nvtxRangePop();
}

}  // namespace pd
