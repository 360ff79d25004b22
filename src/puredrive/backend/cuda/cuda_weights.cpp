// Weights of the CUDA backend: bind_matrix / bind_vector / bind_moe, the device layout of each format, and
// their upload (weight_upload.h) or generation on the device (synthetic sources, synth_source.h).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <vector>

#include "puredrive/backend/cuda/cuda_backend_impl.h"
#include "puredrive/backend/cuda/synth_rng.h"
#include "puredrive/backend/cuda/synth_source.h"

namespace pd::cuda_impl {
namespace {

// backend/validate.h's checks plus what the kernels need: dense rows are read 8 columns at a time.
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

bool same_format(const Matrix& a, const Matrix& b) {
  return a.format == b.format && a.rows == b.rows && a.cols == b.cols &&
         (a.format != WeightFormat::kAffine ||
          (a.bits == b.bits && a.group_size == b.group_size && a.scale_dtype == b.scale_dtype));
}

}  // namespace

Expected<MatrixId> CudaBackend::bind_matrix(const Matrix& m) {
  PD_TRY(validate_cuda_matrix(m));
  PD_ASSIGN_OR_RETURN(DevMatrix d, upload_matrix(m));
  matrices_.push_back(d);
  return MatrixId{static_cast<int32_t>(matrices_.size() - 1)};
}

Expected<VectorId> CudaBackend::bind_vector(std::span<const float> v, const std::string& name) {
  if (v.empty()) return make_error(ErrorCode::kInvalidArgument, "bind_vector: {} is empty", name);
  PD_ASSIGN_OR_RETURN(void* p, device_alloc(static_cast<int64_t>(v.size() * sizeof(float)), name));
  PD_CUDA_TRY(cudaMemcpy(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
  vectors_.push_back({static_cast<float*>(p), static_cast<int64_t>(v.size())});
  return VectorId{static_cast<int32_t>(vectors_.size() - 1)};
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

Expected<void*> CudaBackend::device_alloc(int64_t bytes, const std::string& what) {
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

Status CudaBackend::fill_matrix(const Matrix& m, void* data, void* scales, void* biases,
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
      cuda::launch_synth_dense(data, to_wfmt(m.format), m.rows * m.cols, src->seed, src->amplitude, stream_);
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

DevMatrix CudaBackend::describe(const Matrix& m) const {
  DevMatrix d;
  d.fmt = to_wfmt(m.format);
  d.bits = m.format == WeightFormat::kAffine ? m.bits : 0;
  d.group_size = m.format == WeightFormat::kAffine ? m.group_size : 0;
  d.scale_dtype = to_sdtype(m.scale_dtype);
  d.rows = m.rows;
  d.cols = m.cols;
  return d;
}

Expected<DevMatrix> CudaBackend::upload_matrix(const Matrix& m) {
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

Expected<DevMatrix> CudaBackend::upload_experts(const std::vector<Matrix>& ms, const char* what) {
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

Expected<const DevMatrix*> CudaBackend::matrix(const char* op, MatrixId id) const {
  if (id.index < 0 || id.index >= static_cast<int32_t>(matrices_.size())) {
    return make_error(ErrorCode::kInvalidArgument, "{}: unbound matrix handle {}", op, id.index);
  }
  return &matrices_[static_cast<size_t>(id.index)];
}

Expected<const CudaBackend::DevVector*> CudaBackend::vector(const char* op, VectorId id,
                                                            int64_t expected_size) const {
  if (id.index < 0 || id.index >= static_cast<int32_t>(vectors_.size())) {
    return make_error(ErrorCode::kInvalidArgument, "{}: unbound vector handle {}", op, id.index);
  }
  const DevVector* v = &vectors_[static_cast<size_t>(id.index)];
  if (expected_size >= 0 && v->size != expected_size) {
    return make_error(ErrorCode::kInvalidArgument, "{}: vector {} has {} elements, expected {}", op, id.index,
                      v->size, expected_size);
  }
  return v;
}

}  // namespace pd::cuda_impl
