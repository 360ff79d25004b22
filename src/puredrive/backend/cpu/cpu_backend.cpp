#include "puredrive/backend/cpu/cpu_backend.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "puredrive/backend/cpu/cpu_ops.h"
#include "puredrive/backend/cpu/kernels.h"
#include "puredrive/backend/cpu/sampling.h"
#include "puredrive/backend/validate.h"
#include "puredrive/util/thread_pool.h"

namespace pd {
namespace {

// Argument validation is backend/validate.h's, in CPU memory, plus what only the CPU can read: the
// positions' values (positions checked by validate_gated_attention).
Status check_positions(const char* op, const Tensor& positions, int64_t rows, int64_t capacity) {
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t p = *positions.row<int32_t>(r);
    if (p < 0 || p >= capacity) {
      return make_error(ErrorCode::kInvalidArgument, "{}: position {} of row {} is outside the cache [0, {})",
                        op, p, r, capacity);
    }
  }
  return Status::ok();
}

// MemAvailable from /proc/meminfo (bytes); a large value when it cannot be read.
int64_t mem_available() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return int64_t{1} << 50;
  char line[256];
  int64_t kb = -1;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "MemAvailable: %ld kB", &kb) == 1) break;
  }
  std::fclose(f);
  return kb < 0 ? int64_t{1} << 50 : kb * 1024;
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options)
      : pool_(options.threads),
        ex_{.pool = &pool_, .min_parallel_work = static_cast<double>(options.min_parallel_work)} {}

  Device device() const override { return Device::kCpu; }
  std::string name() const override {
    return fmt::format("cpu ({} threads, {})", pool_.size(), cpu::has_avx2() ? "avx2+fma" : "portable");
  }

  Expected<Buffer> alloc(DType dtype, int64_t rows, int64_t cols) override {
    PD_TRY(validate_alloc(rows, cols));
    const size_t bytes = static_cast<size_t>(rows * cols) * dtype_size(dtype);
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (p == nullptr) {
      return make_error(ErrorCode::kOutOfMemory, "alloc: cannot allocate {} bytes ([{}, {}] {})", bytes, rows,
                        cols, dtype_name(dtype));
    }
    std::memset(p, 0, rounded == 0 ? 64 : rounded);
    Tensor t{.data = p, .dtype = dtype, .rows = rows, .cols = cols, .stride = cols, .device = Device::kCpu};
    return Buffer(t, std::shared_ptr<void>(p, std::free));
  }

  Status upload(const Tensor& dst, const void* src) override {
    copy_rows(dst, src, /*to_host=*/false);
    return Status::ok();
  }
  Status download(void* dst, const Tensor& src) override {
    copy_rows(src, dst, /*to_host=*/true);
    return Status::ok();
  }
  Status copy(const Tensor& dst, const Tensor& src) override {
    PD_TRY(validate_copy(dst, src));
    const size_t row_bytes = static_cast<size_t>(src.cols) * dtype_size(src.dtype);
    for (int64_t r = 0; r < src.rows; ++r) std::memcpy(row_ptr(dst, r), row_ptr(src, r), row_bytes);
    return Status::ok();
  }
  Status fill_zero(const Tensor& dst) override {
    const size_t row_bytes = static_cast<size_t>(dst.cols) * dtype_size(dst.dtype);
    for (int64_t r = 0; r < dst.rows; ++r) std::memset(row_ptr(dst, r), 0, row_bytes);
    return Status::ok();
  }
  Status copy_many(std::span<const CopyRegion> regions) override {
    PD_TRY(validate_copy_many(Device::kCpu, regions));
    for (const CopyRegion& r : regions) {
      if (r.bytes == 0) continue;
      std::memcpy(static_cast<uint8_t*>(r.dst.data) + r.dst_offset,
                  static_cast<const uint8_t*>(r.src.data) + r.src_offset, static_cast<size_t>(r.bytes));
    }
    return Status::ok();
  }
  Status synchronize() override { return Status::ok(); }
  int64_t available_memory() const override { return mem_available(); }

  Expected<MatrixId> bind_matrix(const Matrix& m) override {
    PD_TRY(validate_matrix(m));
    matrices_.push_back(m);
    bound_bytes_ += cpu::matrix_bytes(m);
    return MatrixId{static_cast<int32_t>(matrices_.size() - 1)};
  }
  Expected<VectorId> bind_vector(std::span<const float> v, const std::string& name) override {
    if (v.empty()) return make_error(ErrorCode::kInvalidArgument, "bind_vector: {} is empty", name);
    vectors_.emplace_back(v.begin(), v.end());
    bound_bytes_ += static_cast<int64_t>(v.size() * sizeof(float));
    return VectorId{static_cast<int32_t>(vectors_.size() - 1)};
  }
  Expected<MoeId> bind_moe(const MoeWeights& w, const MoeSpec& spec) override;
  int64_t bound_bytes() const override { return bound_bytes_; }

  Status embed(const EmbedArgs& a) override {
    PD_ASSIGN_OR_RETURN(const Matrix* table, matrix("embed", a.table));
    const int64_t rows = a.tokens.rows;
    PD_TRY(validate_embed(Device::kCpu, a, table->cols));
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t id = *a.tokens.row<int32_t>(r);
      if (id < 0 || id >= table->rows) {
        return make_error(ErrorCode::kInvalidArgument,
                          "embed: token id {} of row {} is outside the vocabulary [0, {})", id, r,
                          table->rows);
      }
    }
    cpu::embed(ex_, *table, a.tokens, a.out);
    return Status::ok();
  }

  Status rms_norm(const RmsNormArgs& a) override {
    PD_ASSIGN_OR_RETURN(const std::vector<float>* w, vector("rms_norm", a.weight));
    const int64_t n = static_cast<int64_t>(w->size());
    PD_TRY(validate_rms_norm(Device::kCpu, a, n));
    cpu::rms_norm(ex_, a.x, w->data(), a.eps, a.out);
    return Status::ok();
  }

  Status add(const AddArgs& a) override {
    PD_TRY(validate_add(Device::kCpu, a));
    cpu::add(ex_, a.a, a.b, a.out);
    return Status::ok();
  }

  Status matmul(const MatmulArgs& a) override {
    PD_ASSIGN_OR_RETURN(const Matrix* w, matrix("matmul", a.w));
    PD_TRY(validate_product(Device::kCpu, "matmul", a.x, a.out, w->rows, w->cols));
    cpu::matmul(ex_, *w, a.x, a.out, a.accum);
    return Status::ok();
  }

  Status gated_attention(const GatedAttentionArgs& a) override {
    PD_TRY(validate_gated_attention(Device::kCpu, a));
    const AttentionDims& d = a.dims;
    const int64_t rows = a.qg.rows;
    PD_TRY(check_positions("gated_attention", a.positions, rows, a.cache.k.rows));
    if (a.window < 0) {
      return make_error(ErrorCode::kInvalidArgument, "gated_attention: window {} is negative", a.window);
    }
    if (a.kv_length != 0 && a.kv_length != *a.positions.row<int32_t>(rows - 1) + 1) {
      return make_error(ErrorCode::kInvalidArgument,
                        "gated_attention: kv_length {} but the last row's position is {}", a.kv_length,
                        *a.positions.row<int32_t>(rows - 1));
    }
    PD_ASSIGN_OR_RETURN(const std::vector<float>* qn, vector("gated_attention", a.q_norm, d.head_dim));
    PD_ASSIGN_OR_RETURN(const std::vector<float>* kn, vector("gated_attention", a.k_norm, d.head_dim));
    cpu::gated_attention(ex_, a, qn->data(), kn->data());
    return Status::ok();
  }

  Status gated_delta_net(const GatedDeltaNetArgs& a) override {
    PD_TRY(validate_gated_delta_net(Device::kCpu, a));
    const GdnDims& d = a.dims;
    const int64_t channels =
        2 * int64_t{d.num_k_heads} * d.k_head_dim + int64_t{d.num_v_heads} * d.v_head_dim;
    cpu::GdnVectors v;
    PD_ASSIGN_OR_RETURN(const std::vector<float>* conv1d,
                        vector("gated_delta_net", a.conv1d, channels * d.conv_kernel));
    PD_ASSIGN_OR_RETURN(const std::vector<float>* a_log, vector("gated_delta_net", a.A_log, d.num_v_heads));
    PD_ASSIGN_OR_RETURN(const std::vector<float>* dt_bias,
                        vector("gated_delta_net", a.dt_bias, d.num_v_heads));
    PD_ASSIGN_OR_RETURN(const std::vector<float>* norm, vector("gated_delta_net", a.norm, d.v_head_dim));
    v.conv1d = *conv1d;
    v.A_log = *a_log;
    v.dt_bias = *dt_bias;
    v.norm = *norm;
    cpu::gated_delta_net(ex_, a, v);
    return Status::ok();
  }

  Status moe(const MoeArgs& a) override {
    if (a.moe.index < 0 || a.moe.index >= static_cast<int32_t>(moes_.size())) {
      return make_error(ErrorCode::kInvalidArgument, "moe: unbound MoE handle {}", a.moe.index);
    }
    const cpu::BoundMoe& m = moes_[static_cast<size_t>(a.moe.index)];
    PD_TRY(validate_moe_args(Device::kCpu, a, m.hidden));
    PD_ASSIGN_OR_RETURN(const Tensor x, normalized_input("moe", a.x, a.norm));
    cpu::moe(ex_, m, x, a.out, a.accum);
    return Status::ok();
  }

  Status argmax(const ArgmaxArgs& a) override {
    PD_TRY(validate_argmax(Device::kCpu, a));
    cpu::argmax(a.x, a.out);
    return Status::ok();
  }

  Status sample(const SampleArgs& a) override {
    PD_TRY(validate_sample(a, Device::kCpu));
    cpu::sample(a);
    return Status::ok();
  }

 private:
  static uint8_t* row_ptr(const Tensor& t, int64_t r) {
    return static_cast<uint8_t*>(t.data) + r * t.stride * static_cast<int64_t>(dtype_size(t.dtype));
  }
  static void copy_rows(const Tensor& t, const void* host, bool to_host) {
    const size_t row_bytes = static_cast<size_t>(t.cols) * dtype_size(t.dtype);
    for (int64_t r = 0; r < t.rows; ++r) {
      uint8_t* dev = row_ptr(t, r);
      const uint8_t* h = static_cast<const uint8_t*>(host) + static_cast<size_t>(r) * row_bytes;
      if (to_host) {
        std::memcpy(const_cast<uint8_t*>(h), dev, row_bytes);
      } else {
        std::memcpy(dev, h, row_bytes);
      }
    }
  }

  Expected<const Matrix*> matrix(const char* op, MatrixId id) const {
    if (id.index < 0 || id.index >= static_cast<int32_t>(matrices_.size())) {
      return make_error(ErrorCode::kInvalidArgument, "{}: unbound matrix handle {}", op, id.index);
    }
    return &matrices_[static_cast<size_t>(id.index)];
  }
  Expected<const std::vector<float>*> vector(const char* op, VectorId id, int64_t expected_size = -1) const {
    if (id.index < 0 || id.index >= static_cast<int32_t>(vectors_.size())) {
      return make_error(ErrorCode::kInvalidArgument, "{}: unbound vector handle {}", op, id.index);
    }
    const std::vector<float>* v = &vectors_[static_cast<size_t>(id.index)];
    if (expected_size >= 0 && static_cast<int64_t>(v->size()) != expected_size) {
      return make_error(ErrorCode::kInvalidArgument, "{}: vector {} has {} elements, expected {}", op,
                        id.index, v->size(), expected_size);
    }
    return v;
  }

  ThreadPool pool_;
  cpu::Exec ex_;
  std::vector<Matrix> matrices_;
  std::deque<std::vector<float>> vectors_;
  std::vector<cpu::BoundMoe> moes_;
  int64_t bound_bytes_ = 0;
};

Expected<MoeId> CpuBackend::bind_moe(const MoeWeights& w, const MoeSpec& spec) {
  PD_TRY(validate_moe(w, spec, validate_matrix));
  const size_t num_experts = w.gate_proj.size();
  const int64_t hidden = w.gate.cols;
  const int64_t inter = w.gate_proj[0].rows;
  const int64_t shared = w.shared_gate_proj.rows;
  cpu::BoundMoe b;
  b.w = w;
  b.spec = spec;
  b.num_experts = static_cast<int>(num_experts);
  b.hidden = static_cast<int>(hidden);
  b.intermediate = static_cast<int>(inter);
  b.shared_intermediate = static_cast<int>(shared);
  int64_t bytes = cpu::matrix_bytes(w.gate) + cpu::matrix_bytes(w.shared_gate_proj) +
                  cpu::matrix_bytes(w.shared_up_proj) + cpu::matrix_bytes(w.shared_down_proj) +
                  cpu::matrix_bytes(w.shared_expert_gate);
  for (size_t e = 0; e < num_experts; ++e) {
    bytes += cpu::matrix_bytes(w.gate_proj[e]) + cpu::matrix_bytes(w.up_proj[e]) +
             cpu::matrix_bytes(w.down_proj[e]);
  }
  bound_bytes_ += bytes;
  moes_.push_back(std::move(b));
  return MoeId{static_cast<int32_t>(moes_.size() - 1)};
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace pd
