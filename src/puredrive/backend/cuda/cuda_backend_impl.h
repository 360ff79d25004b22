// The CUDA backend's class (cuda_backend.h) and what its sources share; internal to them. The class is
// defined over several files, one job each: cuda_backend.cpp (construction, memory, the public functions),
// cuda_steps.cpp (step recording, CUDA graphs, op scratch, profiling), cuda_weights.cpp (binding and
// uploading weights), cuda_ops.cpp (embed, rms_norm, add, matmul(s), argmax, sample) and cuda_layers.cpp
// (gated_attention, gated_delta_net, moe).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "puredrive/backend/cuda/copy_runner.h"
#include "puredrive/backend/cuda/cuda_backend.h"
#include "puredrive/backend/cuda/kernels.h"
#include "puredrive/backend/cuda/weight_upload.h"
#include "puredrive/backend/validate.h"

namespace pd::cuda_impl {

using cuda::DevMatrix;
using cuda::SDType;
using cuda::WFmt;

inline Status cuda_error(cudaError_t e, const char* what) {
  return make_error(ErrorCode::kInternal, "CUDA: {} failed: {} ({})", what, cudaGetErrorString(e),
                    cudaGetErrorName(e));
}

#define PD_CUDA_TRY(call)                                                    \
  do {                                                                       \
    const cudaError_t pd_cuda_err_ = (call);                                 \
    if (pd_cuda_err_ != cudaSuccess) return cuda_error(pd_cuda_err_, #call); \
  } while (0)

inline int64_t round_up(int64_t v, int64_t to) {
  return (v + to - 1) / to * to;
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
  kSample,
  kCopyMany
};

struct BoundMoe {
  cuda::MoeLaunch launch;  // weights, sizes; x/out/rows/scratch filled per call
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {}
  ~CudaBackend() override;

  Status init();

  const CudaDeviceInfo& info() const { return info_; }
  Expected<int64_t> experts_read();
  CudaStepStats stats() const {
    CudaStepStats s = stats_;
    s.cached_graphs = static_cast<int64_t>(graphs_.size());
    return s;
  }

  Device device() const override { return Device::kCuda; }
  std::string name() const override;

  // ---- Memory (cuda_backend.cpp) ----

  Expected<Buffer> alloc(DType dtype, int64_t rows, int64_t cols) override;
  Status upload(const Tensor& dst, const void* src) override;
  Status download(void* dst, const Tensor& src) override;
  Status copy(const Tensor& dst, const Tensor& src) override;
  Status fill_zero(const Tensor& dst) override;
  Status copy_many(std::span<const CopyRegion> regions) override;
  Status synchronize() override;
  int64_t available_memory() const override;

  // ---- Step capture (cuda_steps.cpp) ----

  Status begin_step() override;
  Status end_step() override;

  // ---- Weights (cuda_weights.cpp) ----

  Expected<MatrixId> bind_matrix(const Matrix& m) override;
  Expected<VectorId> bind_vector(std::span<const float> v, const std::string& name) override;
  Expected<MoeId> bind_moe(const MoeWeights& w, const MoeSpec& spec) override;
  int64_t bound_bytes() const override { return bound_bytes_.load(std::memory_order_relaxed); }

  // ---- Ops (cuda_ops.cpp, cuda_layers.cpp) ----

  Status embed(const EmbedArgs& a) override;
  Status rms_norm(const RmsNormArgs& a) override;
  Status add(const AddArgs& a) override;
  Status matmul(const MatmulArgs& a) override;
  Status matmuls(const MatmulsArgs& a) override;
  Status gated_attention(const GatedAttentionArgs& a) override;
  Status gated_delta_net(const GatedDeltaNetArgs& a) override;
  Status moe(const MoeArgs& a) override;
  Status sample(const SampleArgs& a) override;
  Status argmax(const ArgmaxArgs& a) override;

 private:
  struct DevVector {
    float* data = nullptr;
    int64_t size = 0;
  };
  struct GraphEntry {
    std::vector<cudaGraphExec_t> execs;  // launched in order
    int64_t nodes = 0;
  };
  using Launch = std::function<void(cudaStream_t)>;
  Status capture(std::span<Launch> ops, GraphEntry* entry);  // ops as one more graph of the entry

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

  // Input norms (InputNorm) go into the streamed decode products (PD_FUSED_NORM=0: they run as rms_norm
  // launches of their own, for same-run comparisons). The MoE block's runs first: in its gate/up kernel it
  // cost more than the launch it saved (bench/results/2026-12-03-h200-9193037.md).
  static bool fuse_norms() {
    static const bool on = cuda::env_switch_on("PD_FUSED_NORM");
    return on;
  }

  Status check_device(const char* op, const Tensor& t) const {
    if (t.device != Device::kCuda)
      return make_error(ErrorCode::kInvalidArgument, "{}: tensor is not CUDA memory", op);
    return Status::ok();
  }

  // Runs fn now, or records it when a step is being recorded. kind (and rows x cols of a weight) label the op
  // in the profile.
  void submit(Launch fn, const char* kind, int64_t rows = 0, int64_t cols = 0);
  // A prefill product job on the kernel that takes it (cuda::mma_tma_takes, else launch_mma).
  Status submit_mma(const cuda::MmaJob& j, const char* what, int64_t rows, int64_t cols);

 public:
  void set_reference_prefill(bool on);
  void set_profiling(bool on);
  std::vector<CudaOpTime> profile() const;

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
  Status flush_for_host();
  Status run_pending();
  void clear_graphs();
  // Pinned host memory for uploads inside a step.
  Expected<uint8_t*> stage(size_t bytes);
  Status record_copy_many(std::span<const CopyRegion> regions);  // a device-only list inside a step
  Expected<void*> scratch(Scratch& s, int64_t bytes);
  // Frees memory replaced while work may still have referenced it (cudaFree waits for the device).
  void release_retired();

  Expected<void*> device_alloc(int64_t bytes, const std::string& what);
  // Generates matrix m at data / scales / biases (synthetic sources), or appends its host ranges to `copies`
  // for one staged upload (weight_upload.h).
  Status fill_matrix(const Matrix& m, void* data, void* scales, void* biases, std::vector<CopyRange>* copies);
  DevMatrix describe(const Matrix& m) const;
  Expected<DevMatrix> upload_matrix(const Matrix& m);
  // Experts of one projection stacked in one allocation [E][...], all in one format.
  Expected<DevMatrix> upload_experts(const std::vector<Matrix>& ms, const char* what);
  Expected<const DevMatrix*> matrix(const char* op, MatrixId id) const;
  Expected<const DevVector*> vector(const char* op, VectorId id, int64_t expected_size = -1) const;

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
  bool copy_kernels_ =
      true;  // a step's copies, uploads and zero fills as kernels (PD_COPY_KERNELS=0: memcpy)
  bool reference_prefill_ = false;
  int graph_segment_ops_ = 0;            // PD_GRAPH_SEGMENT: ops per graph of a step (0: one graph)
  bool every_step_first_sight_ = false;  // PD_GRAPH_FIRST_SIGHT=1: every new step shape runs eagerly once

  std::vector<void*> weights_;  // device allocations of bound weights
  std::vector<DevMatrix> matrices_;
  std::vector<DevVector> vectors_;
  std::vector<BoundMoe> moes_;
  std::atomic<int64_t> bound_bytes_{0};  // read by load-progress reports from another thread

  static constexpr int kWideArgmax = 16384;  // columns from which argmax spreads a row over many blocks
  Scratch attn_scratch_, gdn_scratch_, moe_scratch_, argmax_scratch_, sample_scratch_, mma_scratch_;
  unsigned long long* experts_read_ = nullptr;  // distinct experts read by decode MoE chunks, ever
  int* router_ticket_ = nullptr;                // MoeLaunch::router_ticket
  std::vector<void*> retired_device_;
  std::vector<uint8_t*> retired_host_;

  // Step recording.
  int step_depth_ = 0;
  bool step_eager_ = false;
  bool step_moved_buffers_ = false;            // a scratch or staging buffer was replaced while recording
  bool step_prefill_ = false;                  // the step holds prefill ops
  std::unordered_set<size_t> prefill_shapes_;  // hashes of the prefill steps' signatures seen
  bool step_recorded_ = false;
  Signature sig_;
  std::vector<Launch> pending_;
  std::unique_ptr<cuda::WeightUploader> uploader_;
  std::unique_ptr<cuda::CopyRunner> copier_;
  uint8_t* staging_ = nullptr;
  uint8_t* staging_device_ = nullptr;  // the staging's mapped address on the device
  size_t staging_bytes_ = 0;
  size_t staging_used_ = 0;
  std::unordered_map<std::string, GraphEntry> graphs_;
  CudaStepStats stats_;
  Status sticky_;
};

}  // namespace pd::cuda_impl
