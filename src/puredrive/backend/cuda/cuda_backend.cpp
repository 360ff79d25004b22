#include "puredrive/backend/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "puredrive/backend/cuda/copy_runner.h"
#include "puredrive/backend/cuda/kernels.h"
#include "puredrive/backend/cuda/sampling.h"
#include "puredrive/backend/cuda/synth_rng.h"
#include "puredrive/backend/cuda/synth_source.h"
#include "puredrive/backend/cuda/weight_upload.h"
#include "puredrive/backend/validate.h"

namespace pd {
namespace {

using cuda::DevMatrix;
using cuda::SDType;
using cuda::WFmt;

Status cuda_error(cudaError_t e, const char* what) {
  return make_error(ErrorCode::kInternal, "CUDA: {} failed: {} ({})", what, cudaGetErrorString(e),
                    cudaGetErrorName(e));
}

#define PD_CUDA_TRY(call)                                                    \
  do {                                                                       \
    const cudaError_t pd_cuda_err_ = (call);                                 \
    if (pd_cuda_err_ != cudaSuccess) return cuda_error(pd_cuda_err_, #call); \
  } while (0)

// ---- Argument validation (backend/validate.h), in CUDA memory, plus what the kernels need: 16-byte aligned
// KV caches and dense rows read 8 columns at a time.

Status check_tensor(const char* op, const char* arg, const Tensor& t, DType dtype, int64_t rows,
                    int64_t cols) {
  return check_tensor_on(Device::kCuda, op, arg, t, dtype, rows, cols);
}

static_assert(cuda::kGdnPrefillChunk == kGdnPrefillChunk, "the prefill kernels' chunk is backend.h's");

Status check_kv(const char* op, const char* arg, const Tensor& t, int64_t cols) {
  PD_TRY(check_kv_layout(op, arg, t, cols));
  if (t.device != Device::kCuda) {
    return make_error(ErrorCode::kInvalidArgument, "{}: {} is not CUDA memory", op, arg);
  }
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) {
    return make_error(ErrorCode::kInvalidArgument, "{}: {} is not 16-byte aligned", op, arg);
  }
  return Status::ok();
}

Status validate_cuda_matrix(const Matrix& m) {
  PD_TRY(validate_matrix(m));
  if (m.format != WeightFormat::kAffine && m.cols % 8 != 0) {
    return make_error(
        ErrorCode::kUnsupported,
        "bind_matrix: {} has {} columns; the CUDA backend reads dense rows 8 columns at a time and needs "
        "a multiple of 8",
        m.name, m.cols);
  }
  return Status::ok();
}

WFmt to_wfmt(WeightFormat f) {
  switch (f) {
    case WeightFormat::kF32:
      return WFmt::kF32;
    case WeightFormat::kF16:
      return WFmt::kF16;
    case WeightFormat::kBF16:
      return WFmt::kBF16;
    case WeightFormat::kAffine:
      return WFmt::kAffine;
  }
  return WFmt::kF32;
}

SDType to_sdtype(DType t) {
  switch (t) {
    case DType::kF16:
      return SDType::kF16;
    case DType::kF32:
      return SDType::kF32;
    default:
      return SDType::kBF16;
  }
}

// Byte sizes of a matrix's parts as the kernels read them.
struct MatrixLayout {
  int64_t data_bytes = 0;
  int64_t scale_bytes = 0;  // each of scales and biases
};

MatrixLayout layout_of(const Matrix& m) {
  MatrixLayout l;
  switch (m.format) {
    case WeightFormat::kF32:
      l.data_bytes = m.rows * m.cols * 4;
      break;
    case WeightFormat::kF16:
    case WeightFormat::kBF16:
      l.data_bytes = m.rows * m.cols * 2;
      break;
    case WeightFormat::kAffine:
      l.data_bytes = m.rows * m.cols * m.bits / 8;
      l.scale_bytes = m.rows * (m.cols / m.group_size) * static_cast<int64_t>(dtype_size(m.scale_dtype));
      break;
  }
  return l;
}

int64_t round_up(int64_t v, int64_t to) {
  return (v + to - 1) / to * to;
}

bool same_format(const Matrix& a, const Matrix& b) {
  return a.format == b.format && a.rows == b.rows && a.cols == b.cols &&
         (a.format != WeightFormat::kAffine ||
          (a.bits == b.bits && a.group_size == b.group_size && a.scale_dtype == b.scale_dtype));
}

// One tensor-core product part: x [R, K] . w^T into out, its weight-row tiles after `tiles_before`.
cuda::MmaPart mma_part(const DevMatrix& w, const Tensor& x, const Tensor& out, int tiles_before) {
  cuda::MmaPart p;
  p.w = w;
  p.x = static_cast<const float*>(x.data);
  p.xs = x.stride;
  p.out = static_cast<float*>(out.data);
  p.os = out.stride;
  p.rows = static_cast<int>(x.rows);
  p.n_tiles_end = tiles_before + static_cast<int>((w.rows + cuda::kMmaCols - 1) / cuda::kMmaCols);
  return p;
}

int mma_row_tiles(int64_t rows) {
  return static_cast<int>((rows + cuda::kMmaRows - 1) / cuda::kMmaRows);
}

// A growable device buffer for op scratch. Growing invalidates captured graphs (they hold the old address).
struct Scratch {
  void* ptr = nullptr;
  int64_t bytes = 0;
};

// The host-side signature of a recorded step: every argument of every op, byte for byte.
// Only collected while a step is being recorded.
class Signature {
 public:
  void start() {
    bytes_.clear();
    on_ = true;
  }
  void stop() { on_ = false; }
  template <typename T>
  void add(const T& v) {
    static_assert(std::is_trivially_copyable_v<T> && std::has_unique_object_representations_v<T>);
    if (on_) bytes_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void add_f(float v) { add(std::bit_cast<uint32_t>(v)); }
  void add_d(double v) { add(std::bit_cast<uint64_t>(v)); }
  void add(const Tensor& t) {
    add(reinterpret_cast<uintptr_t>(t.data));
    add(static_cast<int32_t>(t.dtype));
    add(t.rows);
    add(t.cols);
    add(t.stride);
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
  bool on_ = false;
};

enum class OpTag : uint32_t {
  kUpload = 1,
  kCopy,
  kFillZero,
  kEmbed,
  kRmsNorm,
  kAdd,
  kMatmul,
  kAttention,
  kGdn,
  kMoe,
  kArgmax,
  kMatmuls,
  kSample
};

struct BoundMoe {
  cuda::MoeLaunch launch;  // weights, sizes; x/out/rows/scratch filled per call
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {}
  ~CudaBackend() override {
    cudaSetDevice(device_);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    uploader_.reset();
    copier_.reset();
    clear_graphs();
    release_retired();
    for (void* p : weights_) cudaFree(p);
    for (Scratch* s : {&attn_scratch_, &gdn_scratch_, &moe_scratch_, &sample_scratch_}) {
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

  Status init() {
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
      return make_error(
          ErrorCode::kUnsupported,
          "backend 'cuda': device {} ({}) has compute capability {}.{}; this build targets sm_90", device_,
          prop.name, prop.major, prop.minor);
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
    PD_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&router_ticket_), sizeof(int)));
    PD_CUDA_TRY(cudaMemset(router_ticket_, 0, sizeof(int)));
    PD_CUDA_TRY(cudaDeviceSynchronize());
    const char* env = std::getenv("PD_CUDA_GRAPHS");
    graphs_enabled_ = env == nullptr || std::string(env) != "0";
    return Status::ok();
  }

  const CudaDeviceInfo& info() const { return info_; }
  Expected<int64_t> experts_read() {
    PD_TRY(flush_for_host());
    unsigned long long v = 0;
    PD_CUDA_TRY(cudaMemcpy(&v, experts_read_, sizeof v, cudaMemcpyDeviceToHost));
    return static_cast<int64_t>(v);
  }
  CudaStepStats stats() const {
    CudaStepStats s = stats_;
    s.cached_graphs = static_cast<int64_t>(graphs_.size());
    return s;
  }

  Device device() const override { return Device::kCuda; }
  std::string name() const override {
    return fmt::format("cuda ({}, sm_{}{}, {:.0f} GiB, graphs {})", info_.name, info_.compute_major,
                       info_.compute_minor, static_cast<double>(info_.total_memory) / (1 << 30),
                       graphs_enabled_ ? "on" : "off");
  }

  // ---- Memory ----

  Expected<Buffer> alloc(DType dtype, int64_t rows, int64_t cols) override {
    if (rows < 0 || cols < 0) {
      return make_error(ErrorCode::kInvalidArgument, "alloc: negative shape [{}, {}]", rows, cols);
    }
    const size_t bytes = static_cast<size_t>(rows * cols) * dtype_size(dtype);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 256 : bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return make_error(ErrorCode::kOutOfMemory,
                        "alloc: cannot allocate {} bytes ([{}, {}] {}) on the GPU: {}", bytes, rows, cols,
                        dtype_name(dtype), cudaGetErrorString(e));
    }
    PD_CUDA_TRY(cudaMemsetAsync(p, 0, bytes == 0 ? 256 : bytes, stream_));
    PD_CUDA_TRY(cudaStreamSynchronize(stream_));
    Tensor t{.data = p, .dtype = dtype, .rows = rows, .cols = cols, .stride = cols, .device = Device::kCuda};
    return Buffer(t, std::shared_ptr<void>(p, [](void* q) { cudaFree(q); }));
  }

  Status upload(const Tensor& dst, const void* src) override {
    PD_TRY(check_device("upload", dst));
    const size_t esize = dtype_size(dst.dtype);
    const size_t width = static_cast<size_t>(dst.cols) * esize;
    const size_t bytes = width * static_cast<size_t>(dst.rows);
    if (bytes == 0) return Status::ok();
    if (recording()) {
      // Copy the host data now into pinned staging; the recorded copy (a graph node) reads it at replay.
      PD_ASSIGN_OR_RETURN(uint8_t * staged, stage(bytes));
      std::memcpy(staged, src, bytes);
      sig_.add(OpTag::kUpload);
      sig_.add(dst);
      sig_.add(reinterpret_cast<uintptr_t>(staged));
      const Tensor d = dst;
      submit(
          [d, staged, width, esize](cudaStream_t s) {
            cudaMemcpy2DAsync(d.data, static_cast<size_t>(d.stride) * esize, staged, width, width,
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

  Status download(void* dst, const Tensor& src) override {
    PD_TRY(check_device("download", src));
    PD_TRY(flush_for_host());
    const size_t esize = dtype_size(src.dtype);
    const size_t width = static_cast<size_t>(src.cols) * esize;
    if (width * static_cast<size_t>(src.rows) == 0) return take_error();
    PD_CUDA_TRY(cudaMemcpy2DAsync(dst, width, src.data, static_cast<size_t>(src.stride) * esize, width,
                                  static_cast<size_t>(src.rows), cudaMemcpyDeviceToHost, stream_));
    ++stats_.host_waits;
    PD_CUDA_TRY(cudaStreamSynchronize(stream_));
    if (!recording()) release_retired();
    return take_error();
  }

  Status copy(const Tensor& dst, const Tensor& src) override {
    if (dst.dtype != src.dtype || dst.rows != src.rows || dst.cols != src.cols) {
      return make_error(ErrorCode::kInvalidArgument, "copy: [{}, {}] {} into [{}, {}] {}", src.rows, src.cols,
                        dtype_name(src.dtype), dst.rows, dst.cols, dtype_name(dst.dtype));
    }
    PD_TRY(check_device("copy", dst));
    PD_TRY(check_device("copy", src));
    sig_.add(OpTag::kCopy);
    sig_.add(dst);
    sig_.add(src);
    submit(
        [dst, src](cudaStream_t s) {
          const size_t esize = dtype_size(src.dtype);
          if (dst.contiguous() && src.contiguous()) {  // 1-D: no pitch limit
            cudaMemcpyAsync(dst.data, src.data, static_cast<size_t>(src.nbytes()), cudaMemcpyDeviceToDevice,
                            s);
            return;
          }
          cudaMemcpy2DAsync(dst.data, static_cast<size_t>(dst.stride) * esize, src.data,
                            static_cast<size_t>(src.stride) * esize, static_cast<size_t>(src.cols) * esize,
                            static_cast<size_t>(src.rows), cudaMemcpyDeviceToDevice, s);
        },
        "copy");
    return take_error_if_eager();
  }

  Status fill_zero(const Tensor& dst) override {
    PD_TRY(check_device("fill_zero", dst));
    sig_.add(OpTag::kFillZero);
    sig_.add(dst);
    submit(
        [dst](cudaStream_t s) {
          const size_t esize = dtype_size(dst.dtype);
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

  // One launch per round of copy_plan.h; a region between two host tensors is a memcpy here.
  Status copy_many(std::span<const CopyRegion> regions) override {
    PD_TRY(validate_copy_many(Device::kCuda, regions));
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

  Status synchronize() override {
    PD_TRY(flush_for_host());
    ++stats_.host_waits;
    PD_CUDA_TRY(cudaStreamSynchronize(stream_));
    if (!recording()) release_retired();
    return take_error();
  }

  int64_t available_memory() const override {
    size_t free_bytes = 0, total = 0;
    if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) return 0;
    return static_cast<int64_t>(free_bytes);
  }

  // ---- Step capture ----

  Status begin_step() override {
    if (step_depth_++ > 0) return Status::ok();
    uploader_->release();  // weights are bound before the first step: free the upload threads and buffers
    // Staging is reused by every step: the previous step's copies must have read it.
    const cudaError_t done = step_recorded_ ? cudaEventQuery(step_done_) : cudaSuccess;
    if (done == cudaErrorNotReady) {
      // Not an error: keep it from looking like a failed launch to the next cudaGetLastError().
      if (cudaPeekAtLastError() == cudaErrorNotReady) cudaGetLastError();
      ++stats_.host_waits;
      PD_CUDA_TRY(cudaEventSynchronize(step_done_));
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
    return Status::ok();
  }

  Status end_step() override {
    if (step_depth_ == 0) return make_error(ErrorCode::kInternal, "end_step without begin_step");
    if (--step_depth_ > 0) return Status::ok();
    stats_.record_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - step_begin_time_).count();
    ++stats_.recorded_steps;
    Status st = run_pending();
    sig_.stop();
    if (step_eager_) ++stats_.eager_steps;
    step_eager_ = false;
    PD_CUDA_TRY(cudaEventRecord(step_done_, stream_));
    step_recorded_ = true;
    release_retired();
    PD_TRY(st);
    return take_error();
  }

  // ---- Weights ----

  Expected<MatrixId> bind_matrix(const Matrix& m) override {
    PD_TRY(validate_cuda_matrix(m));
    PD_ASSIGN_OR_RETURN(DevMatrix d, upload_matrix(m));
    matrices_.push_back(d);
    return MatrixId{static_cast<int32_t>(matrices_.size() - 1)};
  }

  Expected<VectorId> bind_vector(std::span<const float> v, const std::string& name) override {
    if (v.empty()) return make_error(ErrorCode::kInvalidArgument, "bind_vector: {} is empty", name);
    PD_ASSIGN_OR_RETURN(void* p, device_alloc(static_cast<int64_t>(v.size() * sizeof(float)), name));
    PD_CUDA_TRY(cudaMemcpy(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
    vectors_.push_back({static_cast<float*>(p), static_cast<int64_t>(v.size())});
    return VectorId{static_cast<int32_t>(vectors_.size() - 1)};
  }

  Expected<MoeId> bind_moe(const MoeWeights& w, const MoeSpec& spec) override;
  int64_t bound_bytes() const override { return bound_bytes_.load(std::memory_order_relaxed); }

  // ---- Ops ----

  Status embed(const EmbedArgs& a) override {
    PD_ASSIGN_OR_RETURN(const DevMatrix* table, matrix("embed", a.table));
    const int64_t rows = a.tokens.rows;
    PD_TRY(check_tensor("embed", "tokens", a.tokens, DType::kI32, -1, 1));
    PD_TRY(check_tensor("embed", "out", a.out, DType::kF32, rows, table->cols));
    sig_.add(OpTag::kEmbed);
    sig_.add(a.table.index);
    sig_.add(a.tokens);
    sig_.add(a.out);
    const DevMatrix t = *table;
    submit(
        [t, a](cudaStream_t s) {
          cuda::launch_embed(t, static_cast<const int32_t*>(a.tokens.data), a.tokens.stride,
                             static_cast<float*>(a.out.data), a.out.stride, static_cast<int>(a.tokens.rows),
                             s);
        },
        "embed");
    return take_error_if_eager();
  }

  Status rms_norm(const RmsNormArgs& a) override {
    PD_ASSIGN_OR_RETURN(const DevVector* w, vector("rms_norm", a.weight));
    PD_TRY(check_tensor("rms_norm", "x", a.x, DType::kF32, -1, w->size));
    PD_TRY(check_tensor("rms_norm", "out", a.out, DType::kF32, a.x.rows, w->size));
    sig_.add(OpTag::kRmsNorm);
    sig_.add(a.x);
    sig_.add(a.weight.index);
    sig_.add_f(a.eps);
    sig_.add(a.out);
    const float* wp = w->data;
    submit(
        [a, wp](cudaStream_t s) {
          cuda::launch_rms_norm(static_cast<const float*>(a.x.data), a.x.stride, wp,
                                static_cast<int>(a.x.cols), a.eps, static_cast<float*>(a.out.data),
                                a.out.stride, static_cast<int>(a.x.rows), s);
        },
        "rms_norm");
    return take_error_if_eager();
  }

  Status add(const AddArgs& a) override {
    PD_TRY(check_tensor("add", "a", a.a, DType::kF32, -1, -1));
    PD_TRY(check_tensor("add", "b", a.b, DType::kF32, a.a.rows, a.a.cols));
    PD_TRY(check_tensor("add", "out", a.out, DType::kF32, a.a.rows, a.a.cols));
    sig_.add(OpTag::kAdd);
    sig_.add(a.a);
    sig_.add(a.b);
    sig_.add(a.out);
    submit(
        [a](cudaStream_t s) {
          cuda::launch_add(static_cast<const float*>(a.a.data), a.a.stride,
                           static_cast<const float*>(a.b.data), a.b.stride, static_cast<float*>(a.out.data),
                           a.out.stride, static_cast<int>(a.a.rows), static_cast<int>(a.a.cols), s);
        },
        "add");
    return take_error_if_eager();
  }

  Status matmul(const MatmulArgs& a) override {
    PD_ASSIGN_OR_RETURN(const DevMatrix* w, matrix("matmul", a.w));
    PD_TRY(check_tensor("matmul", "x", a.x, DType::kF32, -1, w->cols));
    PD_TRY(check_tensor("matmul", "out", a.out, DType::kF32, a.x.rows, w->rows));
    const Kernels k = kernels_for(a.prefill, a.x.rows);
    sig_.add(OpTag::kMatmul);
    sig_.add(a.w.index);
    sig_.add(a.x);
    sig_.add(a.out);
    sig_.add(static_cast<int32_t>(a.accum));
    sig_.add(k);
    const DevMatrix m = *w;
    if (k == Kernels::kTensorCores) {
      cuda::MmaJob j;
      j.part[0] = mma_part(m, a.x, a.out, 0);
      j.parts = 1;
      j.accumulate = a.accum == Accum::kAdd ? 1 : 0;
      const int tiles = mma_row_tiles(a.x.rows);
      submit([j, tiles](cudaStream_t s) { cuda::launch_mma(j, tiles, s); }, "matmul prefill", m.rows, m.cols);
      return take_error_if_eager();
    }
    submit(
        [m, a](cudaStream_t s) {
          const int rows = static_cast<int>(a.x.rows);
          if (rows > cuda::kMaxRows) {
            // Wide steps on the reference path: tiled product, weights read once per kTileRows rows.
            cuda::TileJob j;
            j.w = m;
            j.x = static_cast<const float*>(a.x.data);
            j.xs = a.x.stride;
            j.rows = rows;
            j.out = static_cast<float*>(a.out.data);
            j.os = a.out.stride;
            j.accumulate = a.accum == Accum::kAdd ? 1 : 0;
            cuda::launch_tiled(j, 1, rows, s);
            return;
          }
          cuda::launch_gemv(m, static_cast<const float*>(a.x.data), a.x.stride,
                            static_cast<float*>(a.out.data), a.out.stride, rows, a.accum == Accum::kAdd, s);
        },
        m.fmt == WFmt::kAffine ? "matmul affine" : "matmul", m.rows, m.cols);
    return take_error_if_eager();
  }

  // One launch when every matrix has the format and width of the first (decode steps, and prefill on the
  // tensor cores); otherwise the products one by one (the same kernels either way, so the results are
  // identical).
  Status matmuls(const MatmulsArgs& a) override {
    const size_t count = a.targets.size();
    if (count == 0) return Status::ok();
    const Kernels k = kernels_for(a.prefill, a.x.rows);
    const size_t max_fused =
        static_cast<size_t>(k == Kernels::kTensorCores ? cuda::kMmaMaxParts : cuda::kMaxMulti);
    bool fused = count <= max_fused && k != Kernels::kTiled;
    cuda::GemvMulti g;
    int64_t end = 0;
    for (size_t i = 0; i < count && fused; ++i) {
      const MatmulTarget& t = a.targets[i];
      PD_ASSIGN_OR_RETURN(const DevMatrix* w, matrix("matmuls", t.w));
      PD_TRY(check_tensor("matmuls", "x", a.x, DType::kF32, -1, w->cols));
      PD_TRY(check_tensor("matmuls", "out", t.out, DType::kF32, a.x.rows, w->rows));
      const DevMatrix& first = i == 0 ? *w : g.m[0];
      fused = w->fmt == first.fmt && w->bits == first.bits && w->cols == first.cols &&
              (w->fmt != WFmt::kAffine ||
               (w->group_size == first.group_size && w->scale_dtype == first.scale_dtype));
      end += w->rows;
      g.m[i] = *w;
      g.out[i] = static_cast<float*>(t.out.data);
      g.os[i] = t.out.stride;
      g.end[i] = end;
    }
    if (!fused) return Backend::matmuls(a);
    g.count = static_cast<int>(count);
    sig_.add(OpTag::kMatmuls);
    sig_.add(a.x);
    sig_.add(k);
    for (const MatmulTarget& t : a.targets) {
      sig_.add(t.w.index);
      sig_.add(t.out);
    }
    if (k == Kernels::kTensorCores) {
      cuda::MmaJob j;
      for (size_t i = 0; i < count; ++i) {
        j.part[i] = mma_part(g.m[i], a.x, a.targets[i].out, i == 0 ? 0 : j.part[i - 1].n_tiles_end);
      }
      j.parts = static_cast<int>(count);
      const int tiles = mma_row_tiles(a.x.rows);
      submit([j, tiles](cudaStream_t s) { cuda::launch_mma(j, tiles, s); }, "matmuls prefill", end,
             g.m[0].cols);
      return take_error_if_eager();
    }
    const float* x = static_cast<const float*>(a.x.data);
    const int64_t xs = a.x.stride;
    const int rows = static_cast<int>(a.x.rows);
    submit([g, x, xs, rows](cudaStream_t s) { cuda::launch_gemv_multi(g, x, xs, rows, s); }, "matmuls", end,
           g.m[0].cols);
    return take_error_if_eager();
  }

  Status gated_attention(const GatedAttentionArgs& a) override;
  Status gated_delta_net(const GatedDeltaNetArgs& a) override;
  Status moe(const MoeArgs& a) override;
  Status sample(const SampleArgs& a) override;

  Status argmax(const ArgmaxArgs& a) override {
    PD_TRY(check_tensor("argmax", "x", a.x, DType::kF32, -1, -1));
    PD_TRY(check_tensor("argmax", "out", a.out, DType::kI32, a.x.rows, 1));
    const int n = static_cast<int>(a.x.cols);
    void* scr = nullptr;
    if (n >= kWideArgmax) {
      PD_ASSIGN_OR_RETURN(scr, scratch(argmax_scratch_, int64_t{8} * a.x.rows * cuda::argmax_slices(n)));
    }
    sig_.add(OpTag::kArgmax);
    sig_.add(a.x);
    sig_.add(a.out);
    submit(
        [a, n, scr](cudaStream_t s) {
          const float* x = static_cast<const float*>(a.x.data);
          int32_t* out = static_cast<int32_t*>(a.out.data);
          const int rows = static_cast<int>(a.x.rows);
          if (scr != nullptr) {
            cuda::launch_argmax_wide(x, a.x.stride, n, out, a.out.stride, rows, scr, s);
          } else {
            cuda::launch_argmax(x, a.x.stride, n, out, a.out.stride, rows, s);
          }
        },
        "argmax");
    return take_error_if_eager();
  }

 private:
  struct DevVector {
    float* data = nullptr;
    int64_t size = 0;
  };
  struct GraphEntry {
    cudaGraphExec_t exec = nullptr;
    int64_t nodes = 0;
  };
  using Launch = std::function<void(cudaStream_t)>;

  bool recording() const { return step_depth_ > 0 && !step_eager_; }

  // Which kernels run a product or MoE block: decode (row-exact, up to kMaxRows rows per launch), prefill on
  // the tensor cores (gemm_mma.cu, moe_grouped.cu), or the tiled CUDA-core kernels they replaced (the
  // reference path, for wide steps only).
  enum class Kernels : int32_t { kDecode, kTensorCores, kTiled };
  Kernels kernels_for(bool prefill, int64_t rows) const {
    if (!prefill && rows <= cuda::kMaxRows) return Kernels::kDecode;
    if (!reference_prefill_) return Kernels::kTensorCores;
    return rows <= cuda::kMaxRows ? Kernels::kDecode : Kernels::kTiled;
  }

  Status check_device(const char* op, const Tensor& t) const {
    if (t.device != Device::kCuda)
      return make_error(ErrorCode::kInvalidArgument, "{}: tensor is not CUDA memory", op);
    return Status::ok();
  }

  // Runs fn now, or records it when a step is being recorded. kind (and rows x cols of a weight) label the op
  // in the profile.
  void submit(Launch fn, const char* kind, int64_t rows = 0, int64_t cols = 0) {
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

 public:
  void set_reference_prefill(bool on) {
    if (on == reference_prefill_) return;
    reference_prefill_ = on;
    clear_graphs();
  }

  void set_profiling(bool on) {
    if (on && prof_start_ == nullptr) {
      cudaEventCreate(&prof_start_);
      cudaEventCreate(&prof_end_);
    }
    if (on) profile_.clear();
    profiling_ = on && prof_start_ != nullptr;
  }
  std::vector<CudaOpTime> profile() const {
    std::vector<CudaOpTime> v;
    for (const auto& [label, t] : profile_) v.push_back({label, t.count, t.seconds});
    std::sort(v.begin(), v.end(),
              [](const CudaOpTime& a, const CudaOpTime& b) { return a.seconds > b.seconds; });
    return v;
  }

 private:
  void note_error(cudaError_t e, const char* what) {
    if (e != cudaSuccess && sticky_.is_ok()) sticky_ = cuda_error(e, what);
  }
  Status take_error() {
    Status s = std::move(sticky_);
    sticky_ = Status::ok();
    return s;
  }
  Status take_error_if_eager() { return recording() ? Status::ok() : take_error(); }

  // A download or synchronize inside a step: run what was recorded, and the rest of the step eagerly.
  Status flush_for_host() {
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

  Status run_pending() {
    if (pending_.empty()) return Status::ok();
    std::vector<Launch> ops = std::move(pending_);
    pending_.clear();
    // Ops recorded before a scratch or staging buffer moved hold its old address, which is freed after this
    // step: such a graph must not be replayed, so the step runs eagerly (its next recording is cached).
    if (!graphs_enabled_ || step_moved_buffers_) {
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
      GraphEntry entry;
      const cudaError_t ie = cudaGraphInstantiate(&entry.exec, graph, 0);
      cudaGraphDestroy(graph);
      if (ie != cudaSuccess) return cuda_error(ie, "cudaGraphInstantiate");
      entry.nodes = static_cast<int64_t>(nodes);
      stats_.last_graph_nodes = entry.nodes;
      ++stats_.graphs_captured;
      it = graphs_.emplace(sig_.bytes(), entry).first;
    }
    PD_CUDA_TRY(cudaEventRecord(graph_start_, stream_));
    PD_CUDA_TRY(cudaGraphLaunch(it->second.exec, stream_));
    PD_CUDA_TRY(cudaEventRecord(graph_end_, stream_));
    graph_timed_ = true;
    ++stats_.graph_replays;
    return Status::ok();
  }

  void clear_graphs() {
    for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g.exec);
    graphs_.clear();
  }

  // Pinned host memory for uploads inside a step.
  Expected<uint8_t*> stage(size_t bytes) {
    const size_t need = round_up(static_cast<int64_t>(staging_used_ + bytes), 256);
    if (staging_ == nullptr || need > staging_bytes_) {
      if (staging_ != nullptr) retired_host_.push_back(staging_);
      staging_bytes_ = std::max<size_t>(need * 2, size_t{1} << 20);
      void* p = nullptr;
      PD_CUDA_TRY(cudaHostAlloc(&p, staging_bytes_, cudaHostAllocDefault));
      staging_ = static_cast<uint8_t*>(p);
      staging_used_ = 0;
      clear_graphs();
      if (recording()) step_moved_buffers_ = true;
    }
    uint8_t* out = staging_ + staging_used_;
    staging_used_ = round_up(static_cast<int64_t>(staging_used_ + bytes), 16);
    return out;
  }

  Expected<void*> scratch(Scratch& s, int64_t bytes) {
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

  // Frees memory replaced while work may still have referenced it (cudaFree waits for the device).
  void release_retired() {
    for (void* p : retired_device_) cudaFree(p);
    for (uint8_t* p : retired_host_) cudaFreeHost(p);
    retired_device_.clear();
    retired_host_.clear();
  }

  Expected<void*> device_alloc(int64_t bytes, const std::string& what) {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 256)));
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t free_bytes = 0, total = 0;
      cudaMemGetInfo(&free_bytes, &total);
      return make_error(ErrorCode::kOutOfMemory,
                        "CUDA backend: cannot allocate {:.1f} MiB for {} ({:.1f} MiB free of {:.1f} MiB)",
                        static_cast<double>(bytes) / (1 << 20), what,
                        static_cast<double>(free_bytes) / (1 << 20), static_cast<double>(total) / (1 << 20));
    }
    weights_.push_back(p);
    bound_bytes_ += bytes;
    return p;
  }

  // Generates matrix m at data / scales / biases (synthetic sources), or appends its host ranges to `copies`
  // for one staged upload (weight_upload.h).
  Status fill_matrix(const Matrix& m, void* data, void* scales, void* biases,
                     std::vector<CopyRange>* copies) {
    const MatrixLayout l = layout_of(m);
    if (const synth::SynthSource* src = synth::find_source(m.data)) {
      if (m.format == WeightFormat::kAffine) {
        cuda::launch_synth_words(static_cast<uint32_t*>(data), l.data_bytes / 4, src->seed, stream_);
        const int64_t groups = m.rows * (m.cols / m.group_size);
        cuda::launch_fill_scalar(scales, to_sdtype(m.scale_dtype), groups,
                                 synth::affine_scale(src->amplitude, m.bits), stream_);
        cuda::launch_fill_scalar(biases, to_sdtype(m.scale_dtype), groups, synth::affine_bias(src->amplitude),
                                 stream_);
      } else {
        cuda::launch_synth_dense(data, to_wfmt(m.format), m.rows * m.cols, src->seed, src->amplitude,
                                 stream_);
      }
      PD_CUDA_TRY(cudaGetLastError());
      PD_CUDA_TRY(cudaStreamSynchronize(stream_));
      return Status::ok();
    }
    copies->push_back({data, m.data, static_cast<size_t>(l.data_bytes)});
    if (m.format == WeightFormat::kAffine) {
      copies->push_back({scales, m.scales, static_cast<size_t>(l.scale_bytes)});
      copies->push_back({biases, m.biases, static_cast<size_t>(l.scale_bytes)});
    }
    return Status::ok();
  }

  DevMatrix describe(const Matrix& m) const {
    DevMatrix d;
    d.fmt = to_wfmt(m.format);
    d.bits = m.format == WeightFormat::kAffine ? m.bits : 0;
    d.group_size = m.format == WeightFormat::kAffine ? m.group_size : 0;
    d.scale_dtype = to_sdtype(m.scale_dtype);
    d.rows = m.rows;
    d.cols = m.cols;
    return d;
  }

  Expected<DevMatrix> upload_matrix(const Matrix& m) {
    DevMatrix d = describe(m);
    const MatrixLayout l = layout_of(m);
    // One allocation: data, then scales and biases, each 256-byte aligned.
    const int64_t data_bytes = round_up(l.data_bytes, 256);
    const int64_t scale_bytes = round_up(l.scale_bytes, 256);
    PD_ASSIGN_OR_RETURN(void* p, device_alloc(data_bytes + 2 * scale_bytes, m.name));
    uint8_t* base = static_cast<uint8_t*>(p);
    d.data = base;
    if (m.format == WeightFormat::kAffine) {
      d.scales = base + data_bytes;
      d.biases = base + data_bytes + scale_bytes;
    }
    std::vector<CopyRange> copies;
    PD_TRY(fill_matrix(m, const_cast<void*>(d.data), const_cast<void*>(d.scales), const_cast<void*>(d.biases),
                       &copies));
    PD_TRY(uploader_->copy(copies));
    return d;
  }

  // Experts of one projection stacked in one allocation [E][...], all in one format.
  Expected<DevMatrix> upload_experts(const std::vector<Matrix>& ms, const char* what) {
    for (const Matrix& m : ms) {
      if (!same_format(m, ms[0])) {
        return make_error(
            ErrorCode::kUnsupported,
            "bind_moe: expert {} has a different format or shape than {}; the CUDA backend needs every "
            "expert of a projection ({}) in one format",
            m.name, ms[0].name, what);
      }
    }
    DevMatrix d = describe(ms[0]);
    const MatrixLayout l = layout_of(ms[0]);
    d.data_stride = round_up(l.data_bytes, 256);
    d.scale_stride = round_up(l.scale_bytes, 256);
    const int64_t e = static_cast<int64_t>(ms.size());
    PD_ASSIGN_OR_RETURN(void* p, device_alloc(e * (d.data_stride + 2 * d.scale_stride), ms[0].name));
    uint8_t* base = static_cast<uint8_t*>(p);
    d.data = base;
    if (d.fmt == WFmt::kAffine) {
      d.scales = base + e * d.data_stride;
      d.biases = base + e * (d.data_stride + d.scale_stride);
    }
    std::vector<CopyRange> copies;
    for (int64_t i = 0; i < e; ++i) {
      uint8_t* sc = d.fmt == WFmt::kAffine
                        ? const_cast<uint8_t*>(static_cast<const uint8_t*>(d.scales)) + i * d.scale_stride
                        : nullptr;
      uint8_t* bi = d.fmt == WFmt::kAffine
                        ? const_cast<uint8_t*>(static_cast<const uint8_t*>(d.biases)) + i * d.scale_stride
                        : nullptr;
      PD_TRY(fill_matrix(ms[static_cast<size_t>(i)], base + i * d.data_stride, sc, bi, &copies));
    }
    PD_TRY(uploader_->copy(copies));
    return d;
  }

  Expected<const DevMatrix*> matrix(const char* op, MatrixId id) const {
    if (id.index < 0 || id.index >= static_cast<int32_t>(matrices_.size())) {
      return make_error(ErrorCode::kInvalidArgument, "{}: unbound matrix handle {}", op, id.index);
    }
    return &matrices_[static_cast<size_t>(id.index)];
  }
  Expected<const DevVector*> vector(const char* op, VectorId id, int64_t expected_size = -1) const {
    if (id.index < 0 || id.index >= static_cast<int32_t>(vectors_.size())) {
      return make_error(ErrorCode::kInvalidArgument, "{}: unbound vector handle {}", op, id.index);
    }
    const DevVector* v = &vectors_[static_cast<size_t>(id.index)];
    if (expected_size >= 0 && v->size != expected_size) {
      return make_error(ErrorCode::kInvalidArgument, "{}: vector {} has {} elements, expected {}", op,
                        id.index, v->size, expected_size);
    }
    return v;
  }

  static constexpr size_t kMaxGraphs = 512;

  int device_;
  CudaDeviceInfo info_;
  size_t smem_optin_ = 48 * 1024;  // opt-in dynamic shared memory per block
  cudaStream_t stream_ = nullptr;
  cudaEvent_t step_done_ = nullptr;
  cudaEvent_t graph_start_ = nullptr, graph_end_ = nullptr;
  cudaEvent_t prof_start_ = nullptr, prof_end_ = nullptr;
  bool profiling_ = false;
  std::map<std::string, CudaOpTime> profile_;
  bool graph_timed_ = false;
  std::chrono::steady_clock::time_point step_begin_time_;
  bool graphs_enabled_ = true;
  bool reference_prefill_ = false;

  std::vector<void*> weights_;  // device allocations of bound weights
  std::vector<DevMatrix> matrices_;
  std::vector<DevVector> vectors_;
  std::vector<BoundMoe> moes_;
  std::atomic<int64_t> bound_bytes_{0};  // read by load-progress reports from another thread

  static constexpr int kWideArgmax = 16384;  // columns from which argmax spreads a row over many blocks
  Scratch attn_scratch_, gdn_scratch_, moe_scratch_, argmax_scratch_, sample_scratch_;
  unsigned long long* experts_read_ = nullptr;  // distinct experts read by decode MoE chunks, ever
  int* router_ticket_ = nullptr;                // MoeLaunch::router_ticket
  std::vector<void*> retired_device_;
  std::vector<uint8_t*> retired_host_;

  // Step recording.
  int step_depth_ = 0;
  bool step_eager_ = false;
  bool step_moved_buffers_ = false;  // a scratch or staging buffer was replaced while recording
  bool step_recorded_ = false;
  Signature sig_;
  std::vector<Launch> pending_;
  std::unique_ptr<cuda::WeightUploader> uploader_;
  std::unique_ptr<cuda::CopyRunner> copier_;
  uint8_t* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  size_t staging_used_ = 0;
  std::unordered_map<std::string, GraphEntry> graphs_;
  CudaStepStats stats_;
  Status sticky_;
};

cuda::SampleRowParams row_params(const SampleParams& p) {
  return {.temperature = p.temperature,
          .top_k = p.top_k,
          .top_p = p.top_p,
          .min_p = p.min_p,
          .presence = p.presence_penalty,
          .frequency = p.frequency_penalty,
          .repetition = p.repetition_penalty};
}

// The kernels (sampling_*.cu) are C++17 and cannot see backend.h: they repeat its layout constants.
static_assert(kSampleMaxRows == 16 && kSampleMaxLogprobs == 20 && kHistoryPromptBit == (1 << 30) &&
              kControlSeed == 0 && kControlPosition == 1 && kControlUniforms == 2 && kSampleOutStatus == 0 &&
              kSampleOutAccepted == 3 && kSampleOutTokens == 4 && kSampleMaxVocab == (1 << 20));
static_assert(static_cast<int>(SampleStatus::kNonFinite) == 1 &&
              static_cast<int>(SampleStatus::kAllMasked) == 2 &&
              static_cast<int>(SampleStatus::kDraftNotInDraft) == 3 &&
              static_cast<int>(SampleStatus::kBadToken) == 4);

Status CudaBackend::sample(const SampleArgs& a) {
  PD_TRY(validate_sample(a, Device::kCuda));
  const bool needs_q = a.rule == SampleRule::kTokenwise || a.rule == SampleRule::kBlock;
  cuda::SampleLaunch l;
  l.rule = static_cast<int>(a.rule);
  l.faulty = a.faulty;
  l.target = row_params(a.target);
  l.draft = row_params(a.draft);
  l.logits = static_cast<const float*>(a.logits.data);
  l.logits_stride = a.logits.stride;
  l.rows = static_cast<int>(a.logits.rows);
  l.vocab = static_cast<int>(a.logits.cols);
  l.draft_rows = needs_q ? l.rows - 1 : 0;
  if (l.draft_rows > 0) {
    l.draft_logits = static_cast<const float*>(a.draft_logits.data);
    l.draft_stride = a.draft_logits.stride;
  }
  l.drafts = static_cast<int32_t*>(a.drafts.data);
  l.prior = a.prior;
  l.write_draft = a.write_draft ? 1 : 0;
  l.bias = static_cast<const float*>(a.bias.data);
  l.history = static_cast<int32_t*>(a.history.data);
  l.commit = a.commit ? 1 : 0;
  l.control = static_cast<const int64_t*>(a.control.data);
  l.logprobs = a.logprobs;
  l.out = static_cast<int32_t*>(a.out.data);
  PD_ASSIGN_OR_RETURN(l.scratch, scratch(sample_scratch_, cuda::sample_scratch_bytes(l.rows, l.draft_rows,
                                                                                     l.vocab, l.logprobs)));
  sig_.add(OpTag::kSample);
  for (int32_t v :
       {l.rule, l.faulty, l.prior, l.write_draft, l.commit, l.logprobs, a.target.top_k, a.draft.top_k}) {
    sig_.add(v);
  }
  for (const SampleParams* p : {&a.target, &a.draft}) {
    for (float f : {p->temperature, p->top_p, p->min_p, p->presence_penalty, p->frequency_penalty,
                    p->repetition_penalty}) {
      sig_.add_f(f);
    }
  }
  for (const Tensor* t : {&a.logits, &a.draft_logits, &a.drafts, &a.bias, &a.history, &a.control, &a.out}) {
    sig_.add(*t);
  }
  submit([l](cudaStream_t s) { cuda::launch_sample(l, s); }, "sample");
  return take_error_if_eager();
}

Status CudaBackend::gated_attention(const GatedAttentionArgs& a) {
  const AttentionDims& d = a.dims;
  if (d.num_heads <= 0 || d.num_kv_heads <= 0 || d.num_heads % d.num_kv_heads != 0 || d.head_dim <= 0 ||
      d.rotary_dim < 0 || d.rotary_dim > d.head_dim || d.rotary_dim % 2 != 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "gated_attention: bad dims (heads {}, kv heads {}, head dim {}, rotary dim {})",
                      d.num_heads, d.num_kv_heads, d.head_dim, d.rotary_dim);
  }
  if (d.head_dim % 8 != 0 || d.head_dim > 1024 || d.num_heads / d.num_kv_heads > cuda::kMaxGroup) {
    return make_error(
        ErrorCode::kUnsupported,
        "gated_attention: the CUDA kernels need a head dim that is a multiple of 8 and at most 1024 and "
        "at most {} query heads per KV head (got head dim {}, {} heads per KV head)",
        cuda::kMaxGroup, d.head_dim, d.num_heads / d.num_kv_heads);
  }
  if (a.window != 0) {
    return make_error(ErrorCode::kUnsupported,
                      "gated_attention: a window of {} positions asked; the CUDA attention kernels attend "
                      "every cached position (the MTP attention window runs on the CPU backend only)",
                      a.window);
  }
  const int64_t rows = a.qg.rows;
  const int64_t q_width = int64_t{d.num_heads} * d.head_dim;
  const int64_t kv_width = int64_t{d.num_kv_heads} * d.head_dim;
  PD_TRY(check_tensor("gated_attention", "qg", a.qg, DType::kF32, -1, 2 * q_width));
  PD_TRY(check_tensor("gated_attention", "k", a.k, DType::kF32, rows, kv_width));
  PD_TRY(check_tensor("gated_attention", "v", a.v, DType::kF32, rows, kv_width));
  PD_TRY(check_tensor("gated_attention", "out", a.out, DType::kF32, rows, q_width));
  PD_TRY(check_tensor("gated_attention", "positions", a.positions, DType::kI32, rows, 1));
  PD_TRY(check_kv("gated_attention", "cache.k", a.cache.k, kv_width));
  PD_TRY(check_kv("gated_attention", "cache.v", a.cache.v, kv_width));
  if (a.cache.k.rows != a.cache.v.rows || a.cache.k.dtype != a.cache.v.dtype) {
    return make_error(ErrorCode::kInvalidArgument,
                      "gated_attention: cache.k and cache.v differ in shape or dtype");
  }
  PD_ASSIGN_OR_RETURN(const DevVector* qn, vector("gated_attention", a.q_norm, d.head_dim));
  PD_ASSIGN_OR_RETURN(const DevVector* kn, vector("gated_attention", a.k_norm, d.head_dim));
  cuda::AttentionLaunch l;
  l.smem_limit = smem_optin_;
  l.multiprocessors = info_.multiprocessors;
  l.num_heads = d.num_heads;
  l.num_kv_heads = d.num_kv_heads;
  l.head_dim = d.head_dim;
  l.rotary_dim = d.rotary_dim;
  l.rope_theta = static_cast<float>(d.rope_theta);
  l.eps = d.eps;
  l.qg = static_cast<const float*>(a.qg.data);
  l.qg_stride = a.qg.stride;
  l.k = static_cast<const float*>(a.k.data);
  l.k_stride = a.k.stride;
  l.v = static_cast<const float*>(a.v.data);
  l.v_stride = a.v.stride;
  l.q_norm = qn->data;
  l.k_norm = kn->data;
  l.positions = static_cast<const int32_t*>(a.positions.data);
  l.position_stride = a.positions.stride;
  l.cache_k = a.cache.k.data;
  l.cache_v = a.cache.v.data;
  l.cache_bf16 = a.cache.k.dtype == DType::kBF16;
  l.capacity = a.cache.k.rows;
  l.out = static_cast<float*>(a.out.data);
  l.out_stride = a.out.stride;
  l.rows = static_cast<int>(rows);
  l.prefill = a.prefill && !reference_prefill_;
  PD_ASSIGN_OR_RETURN(void* scr, scratch(attn_scratch_, cuda::attention_scratch_floats(l) * 4));
  l.scratch = static_cast<float*>(scr);

  sig_.add(OpTag::kAttention);
  for (int v : {d.num_heads, d.num_kv_heads, d.head_dim, d.rotary_dim}) sig_.add(v);
  sig_.add_d(d.rope_theta);
  sig_.add_f(d.eps);
  for (const Tensor* t : {&a.qg, &a.k, &a.v, &a.positions, &a.cache.k, &a.cache.v, &a.out}) sig_.add(*t);
  sig_.add(a.q_norm.index);
  sig_.add(a.k_norm.index);
  sig_.add(static_cast<int32_t>(l.prefill));
  submit([l](cudaStream_t s) { cuda::launch_attention(l, s); }, "gated_attention");
  return take_error_if_eager();
}

Status CudaBackend::gated_delta_net(const GatedDeltaNetArgs& a) {
  PD_TRY(validate_gated_delta_net(Device::kCuda, a));
  const GdnDims& d = a.dims;
  if (!cuda::gdn_supported(d.k_head_dim, d.v_head_dim) || d.conv_kernel > cuda::kMaxConvKernel) {
    return make_error(
        ErrorCode::kUnsupported,
        "gated_delta_net: the CUDA kernels support key head dims 16/32/64/128/256, value head dims "
        "8..128 (multiples of 8) and conv kernels up to {} (got {}, {}, {})",
        cuda::kMaxConvKernel, d.k_head_dim, d.v_head_dim, d.conv_kernel);
  }
  if (a.prefill && cuda::gdn_prefill_smem_bytes(d.k_head_dim, d.v_head_dim) > smem_optin_) {
    return make_error(
        ErrorCode::kUnsupported,
        "gated_delta_net: the prefill kernels need {} bytes of shared memory for key head dim {} "
        "and value head dim {}; the device allows {}",
        cuda::gdn_prefill_smem_bytes(d.k_head_dim, d.v_head_dim), d.k_head_dim, d.v_head_dim, smem_optin_);
  }
  const int64_t rows = a.qkv.rows;
  const int64_t channels = 2 * int64_t{d.num_k_heads} * d.k_head_dim + int64_t{d.num_v_heads} * d.v_head_dim;
  PD_ASSIGN_OR_RETURN(const DevVector* conv1d, vector("gated_delta_net", a.conv1d, channels * d.conv_kernel));
  PD_ASSIGN_OR_RETURN(const DevVector* a_log, vector("gated_delta_net", a.A_log, d.num_v_heads));
  PD_ASSIGN_OR_RETURN(const DevVector* dt_bias, vector("gated_delta_net", a.dt_bias, d.num_v_heads));
  PD_ASSIGN_OR_RETURN(const DevVector* norm, vector("gated_delta_net", a.norm, d.v_head_dim));
  const int64_t scratch_floats =
      a.prefill ? cuda::gdn_prefill_scratch_floats(static_cast<int>(channels), d.num_v_heads, d.k_head_dim,
                                                   d.v_head_dim, static_cast<int>(rows))
                : cuda::gdn_scratch_floats(static_cast<int>(channels));
  PD_ASSIGN_OR_RETURN(void* scr, scratch(gdn_scratch_, scratch_floats * 4));

  cuda::GdnLaunch g;
  g.num_k_heads = d.num_k_heads;
  g.num_v_heads = d.num_v_heads;
  g.k_head_dim = d.k_head_dim;
  g.v_head_dim = d.v_head_dim;
  g.conv_kernel = d.conv_kernel;
  g.eps = d.eps;
  g.qkv = static_cast<const float*>(a.qkv.data);
  g.qkv_stride = a.qkv.stride;
  g.z = static_cast<const float*>(a.z.data);
  g.z_stride = a.z.stride;
  g.b = static_cast<const float*>(a.b.data);
  g.b_stride = a.b.stride;
  g.a = static_cast<const float*>(a.a.data);
  g.a_stride = a.a.stride;
  g.conv1d = conv1d->data;
  g.A_log = a_log->data;
  g.dt_bias = dt_bias->data;
  g.norm = norm->data;
  g.conv_state = static_cast<float*>(a.state.conv.data);
  g.recurrent = static_cast<float*>(a.state.recurrent.data);
  if (!a.snapshots.empty()) {
    g.snap_conv = static_cast<float*>(a.snapshots.conv.data);
    g.snap_conv_stride = a.snapshots.conv.stride;
    g.snap_recurrent = static_cast<float*>(a.snapshots.recurrent.data);
    g.snap_recurrent_stride = a.snapshots.recurrent.stride;
  }
  g.out = static_cast<float*>(a.out.data);
  g.out_stride = a.out.stride;
  g.rows = static_cast<int>(rows);
  g.scratch = static_cast<float*>(scr);
  if (a.prefill) {
    g.chunk_offset = a.position % cuda::kGdnPrefillChunk;
    const cuda::GdnPrefillCaps caps = cuda::gdn_prefill_caps(g.rows);
    g.seg_rows_cap = caps.rows;
    g.seg_chunks_cap = caps.chunks;
  }

  sig_.add(OpTag::kGdn);
  // A recorded prefill replays its chunk boundaries: they depend on the position modulo the chunk only.
  for (int v : {d.num_k_heads, d.num_v_heads, d.k_head_dim, d.v_head_dim, d.conv_kernel, int{a.prefill},
                g.chunk_offset}) {
    sig_.add(v);
  }
  sig_.add_f(d.eps);
  for (const Tensor* t : {&a.qkv, &a.z, &a.b, &a.a, &a.state.conv, &a.state.recurrent, &a.snapshots.conv,
                          &a.snapshots.recurrent, &a.out}) {
    sig_.add(*t);
  }
  for (VectorId id : {a.conv1d, a.A_log, a.dt_bias, a.norm}) sig_.add(id.index);
  if (a.prefill) {
    submit([g](cudaStream_t s) { cuda::launch_gated_delta_net_prefill(g, s); }, "gated_delta_net prefill");
  } else {
    submit([g](cudaStream_t s) { cuda::launch_gated_delta_net(g, s); }, "gated_delta_net");
  }
  return take_error_if_eager();
}

Status CudaBackend::moe(const MoeArgs& a) {
  if (a.moe.index < 0 || a.moe.index >= static_cast<int32_t>(moes_.size())) {
    return make_error(ErrorCode::kInvalidArgument, "moe: unbound MoE handle {}", a.moe.index);
  }
  const BoundMoe& m = moes_[static_cast<size_t>(a.moe.index)];
  PD_TRY(check_tensor("moe", "x", a.x, DType::kF32, -1, m.launch.hidden));
  PD_TRY(check_tensor("moe", "out", a.out, DType::kF32, a.x.rows, m.launch.hidden));
  if (a.x.data == a.out.data) return make_error(ErrorCode::kInvalidArgument, "moe: out aliases x");
  if (reinterpret_cast<uintptr_t>(a.x.data) % 16 != 0 || a.x.stride % 4 != 0) {
    return make_error(ErrorCode::kUnsupported,
                      "moe: x must be 16-byte aligned with a row stride divisible by 4");
  }
  const Kernels k = kernels_for(a.prefill, a.x.rows);
  const cuda::MoeLaunch& b = m.launch;
  const int64_t bytes = k == Kernels::kTensorCores
                            ? cuda::moe_grouped_scratch_bytes(static_cast<int>(a.x.rows), b.experts, b.top_k,
                                                              b.hidden, b.inter, b.shared_inter)
                            : cuda::moe_scratch_bytes(b.experts, b.top_k, b.hidden, b.inter, b.shared_inter);
  PD_ASSIGN_OR_RETURN(void* scr, scratch(moe_scratch_, bytes));
  cuda::MoeLaunch l = m.launch;
  l.x = static_cast<const float*>(a.x.data);
  l.x_stride = a.x.stride;
  l.out = static_cast<float*>(a.out.data);
  l.out_stride = a.out.stride;
  l.accumulate = a.accum == Accum::kAdd;
  l.rows = static_cast<int>(a.x.rows);
  l.scratch = scr;
  l.experts_read = experts_read_;
  l.router_ticket = router_ticket_;
  sig_.add(OpTag::kMoe);
  sig_.add(a.moe.index);
  sig_.add(static_cast<int32_t>(a.accum));
  sig_.add(a.x);
  sig_.add(a.out);
  sig_.add(k);
  if (k == Kernels::kTensorCores) {
    submit([l](cudaStream_t s) { cuda::launch_moe_grouped(l, s); }, "moe prefill");
    return take_error_if_eager();
  }
  if (profiling_ && !recording()) {
    double ms[cuda::kMoePhases] = {};
    cuda::launch_moe_profiled(l, stream_, ms);
    note_error(cudaGetLastError(), "kernel launch");
    static const char* const kPhases[cuda::kMoePhases] = {
        "moe: router + shared gate + route", "moe: gate/up experts", "moe: down experts + combine"};
    for (int i = 0; i < cuda::kMoePhases; ++i) {
      CudaOpTime& t = profile_[kPhases[i]];
      ++t.count;
      t.seconds += ms[i] * 1e-3;
    }
    return take_error();
  }
  submit([l](cudaStream_t s) { cuda::launch_moe(l, s); }, "moe");
  return take_error_if_eager();
}

Expected<MoeId> CudaBackend::bind_moe(const MoeWeights& w, const MoeSpec& spec) {
  PD_TRY(validate_moe(w, spec, validate_cuda_matrix));
  const size_t num_experts = w.gate_proj.size();
  if (num_experts > 1024 || spec.num_experts_per_tok > cuda::kMaxTopK) {
    return make_error(
        ErrorCode::kUnsupported,
        "bind_moe: the CUDA router supports up to 1024 experts and top-{} (got {} experts, top-{})",
        cuda::kMaxTopK, num_experts, spec.num_experts_per_tok);
  }
  const int64_t hidden = w.gate.cols;
  const int64_t inter = w.gate_proj[0].rows;
  const int64_t shared = w.shared_gate_proj.rows;

  BoundMoe b;
  cuda::MoeLaunch& l = b.launch;
  PD_ASSIGN_OR_RETURN(l.router, upload_matrix(w.gate));
  PD_ASSIGN_OR_RETURN(l.shared_gate, upload_matrix(w.shared_expert_gate));
  PD_ASSIGN_OR_RETURN(l.gate, upload_experts(w.gate_proj, "gate_proj"));
  PD_ASSIGN_OR_RETURN(l.up, upload_experts(w.up_proj, "up_proj"));
  PD_ASSIGN_OR_RETURN(l.down, upload_experts(w.down_proj, "down_proj"));
  PD_ASSIGN_OR_RETURN(l.sh_gate, upload_matrix(w.shared_gate_proj));
  PD_ASSIGN_OR_RETURN(l.sh_up, upload_matrix(w.shared_up_proj));
  PD_ASSIGN_OR_RETURN(l.sh_down, upload_matrix(w.shared_down_proj));
  l.experts = static_cast<int>(num_experts);
  l.top_k = spec.num_experts_per_tok;
  l.hidden = static_cast<int>(hidden);
  l.inter = static_cast<int>(inter);
  l.shared_inter = static_cast<int>(shared);
  l.norm_topk = spec.norm_topk_prob;
  // Kernels are specialised on format and width; group size and scale type are read at run time.
  auto same = [](const DevMatrix& p, const DevMatrix& q) { return p.fmt == q.fmt && p.bits == q.bits; };
  l.router_gate_fused = same(l.router, l.shared_gate);
  l.shared_format_differs = !same(l.sh_gate, l.gate) || !same(l.sh_up, l.up) || !same(l.sh_down, l.down);
  // Size the shared scratch now, outside any step.
  Expected<void*> scr =
      scratch(moe_scratch_, cuda::moe_scratch_bytes(l.experts, l.top_k, l.hidden, l.inter, l.shared_inter));
  if (!scr.has_value()) return scr.status();
  moes_.push_back(b);
  return MoeId{static_cast<int32_t>(moes_.size() - 1)};
}

}  // namespace

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
