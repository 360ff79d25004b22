// The CUDA backend's dense ops and sampling: embed, rms_norm, add, matmul, matmuls, argmax, sample (kernels
// in ops_dense.cu, gemv_mma.cu, gemm_mma.cu, gemm_tiled.cu, sampling_*.cu).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "puredrive/backend/cpu/sampling.h"
#include "puredrive/backend/cuda/cuda_backend_impl.h"
#include "puredrive/backend/cuda/sampling.h"

namespace pd::cuda_impl {
namespace {

// One tensor-core product part: x [R, K] . w^T into out, its weight-row tiles after `tiles_before`.
cuda::MmaPart mma_part(const DevMatrix& w, const Tensor& x, const Tensor& out, int tiles_before, int cols) {
  cuda::MmaPart p;
  p.w = w;
  p.x = static_cast<const float*>(x.data);
  p.xs = x.stride;
  p.out = static_cast<float*>(out.data);
  p.os = out.stride;
  p.rows = static_cast<int>(x.rows);
  p.n_tiles_end = tiles_before + static_cast<int>((w.rows + cols - 1) / cols);
  return p;
}

int mma_row_tiles(int64_t rows) {
  return static_cast<int>((rows + cuda::kMmaRows - 1) / cuda::kMmaRows);
}

cuda::SampleRowParams row_params(const SampleParams& p) {
  return {.temperature = p.temperature,
          .top_k = p.top_k,
          .top_p = p.top_p,
          .min_p = p.min_p,
          .presence = p.presence_penalty,
          .frequency = p.frequency_penalty,
          .repetition = p.repetition_penalty};
}

}  // namespace

// The kernels (sampling_*.cu) are C++17 and cannot see backend.h: they repeat its layout constants.
static_assert(kSampleMaxRows == 16 && kSampleMaxLogprobs == 20 && kHistoryPromptBit == (1 << 30) &&
              kControlSeed == 0 && kControlPosition == 1 && kControlUniforms == 2 && kSampleOutStatus == 0 &&
              kSampleOutAccepted == 3 && kSampleOutTokens == 4 && kSampleMaxVocab == (1 << 20));
static_assert(static_cast<int>(SampleStatus::kNonFinite) == 1 &&
              static_cast<int>(SampleStatus::kAllMasked) == 2 &&
              static_cast<int>(SampleStatus::kDraftNotInDraft) == 3 &&
              static_cast<int>(SampleStatus::kBadToken) == 4);
static_assert(static_cast<int>(cuda::SampleRule::kGreedy) == static_cast<int>(SampleRule::kGreedy) &&
              static_cast<int>(cuda::SampleRule::kTokenwise) == static_cast<int>(SampleRule::kTokenwise) &&
              static_cast<int>(cuda::SampleRule::kBlockwise) == static_cast<int>(SampleRule::kBlock) &&
              static_cast<int>(cuda::SampleRule::kSeeded) == static_cast<int>(SampleRule::kSeeded));
static_assert(static_cast<int32_t>(cuda::Faulty::kBlockUncapped) == sampling::kFaultyBlockUncapped &&
              static_cast<int32_t>(cuda::Faulty::kBlockFirstFailure) == sampling::kFaultyBlockFirstFailure &&
              static_cast<int32_t>(cuda::Faulty::kTokenwiseResample) == sampling::kFaultyTokenwiseResample);

Status CudaBackend::embed(const EmbedArgs& a) {
  PD_ASSIGN_OR_RETURN(const DevMatrix* table, matrix("embed", a.table));
  PD_TRY(validate_embed(Device::kCuda, a, table->cols));
  sig_.add(OpTag::kEmbed);
  sig_.add(a.table.index);
  sig_.add(a.tokens);
  sig_.add(a.out);
  const DevMatrix t = *table;
  submit(
      [t, a](cudaStream_t s) {
        cuda::launch_embed(t, static_cast<const int32_t*>(a.tokens.data), a.tokens.stride,
                           static_cast<float*>(a.out.data), a.out.stride, static_cast<int>(a.tokens.rows), s);
      },
      "embed");
  return take_error_if_eager();
}

Status CudaBackend::rms_norm(const RmsNormArgs& a) {
  PD_ASSIGN_OR_RETURN(const DevVector* w, vector("rms_norm", a.weight));
  PD_TRY(validate_rms_norm(Device::kCuda, a, w->size));
  sig_.add(OpTag::kRmsNorm);
  sig_.add(a.x);
  sig_.add(a.weight.index);
  sig_.add_f(a.eps);
  sig_.add(a.out);
  const float* wp = w->data;
  submit(
      [a, wp](cudaStream_t s) {
        cuda::launch_rms_norm(static_cast<const float*>(a.x.data), a.x.stride, wp, static_cast<int>(a.x.cols),
                              a.eps, static_cast<float*>(a.out.data), a.out.stride,
                              static_cast<int>(a.x.rows), s);
      },
      "rms_norm");
  return take_error_if_eager();
}

Status CudaBackend::add(const AddArgs& a) {
  PD_TRY(validate_add(Device::kCuda, a));
  sig_.add(OpTag::kAdd);
  sig_.add(a.a);
  sig_.add(a.b);
  sig_.add(a.out);
  submit(
      [a](cudaStream_t s) {
        cuda::launch_add(static_cast<const float*>(a.a.data), a.a.stride, static_cast<const float*>(a.b.data),
                         a.b.stride, static_cast<float*>(a.out.data), a.out.stride,
                         static_cast<int>(a.a.rows), static_cast<int>(a.a.cols), s);
      },
      "add");
  return take_error_if_eager();
}

Status CudaBackend::submit_mma(const cuda::MmaJob& j, const char* what, int64_t rows, int64_t cols) {
  const int tiles = mma_row_tiles(j.part[0].rows);
  if (cuda::mma_tma_takes(j)) {
    PD_ASSIGN_OR_RETURN(void* scr, scratch(mma_scratch_, cuda::mma_tma_scratch_bytes(j, tiles)));
    submit([j, tiles, scr](cudaStream_t s) { cuda::launch_mma_tma(j, tiles, scr, s); }, what, rows, cols);
  } else {
    submit([j, tiles](cudaStream_t s) { cuda::launch_mma(j, tiles, s); }, what, rows, cols);
  }
  return take_error_if_eager();
}

Status CudaBackend::matmul(const MatmulArgs& a) {
  PD_ASSIGN_OR_RETURN(const DevMatrix* w, matrix("matmul", a.w));
  PD_TRY(validate_product(Device::kCuda, "matmul", a.x, a.out, w->rows, w->cols));
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
    j.tile_cols = cuda::mma_tile_cols(m, nullptr);
    j.part[0] = mma_part(m, a.x, a.out, 0, j.tile_cols);
    j.parts = 1;
    j.accumulate = a.accum == Accum::kAdd;
    return submit_mma(j, "matmul prefill", m.rows, m.cols);
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
          j.accumulate = a.accum == Accum::kAdd;
          cuda::launch_tiled(j, 1, rows, s);
          return;
        }
        cuda::launch_gemv(m, static_cast<const float*>(a.x.data), a.x.stride, static_cast<float*>(a.out.data),
                          a.out.stride, rows, a.accum == Accum::kAdd, s);
      },
      m.fmt == WFmt::kAffine ? "matmul affine" : "matmul", m.rows, m.cols);
  return take_error_if_eager();
}

// One launch when every matrix has the format and width of the first (decode steps, and prefill on the
// tensor cores); otherwise the products one by one (the same kernels either way, so the results are
// identical).
Status CudaBackend::matmuls(const MatmulsArgs& a) {
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
    PD_TRY(validate_product(Device::kCuda, "matmuls", a.x, t.out, w->rows, w->cols));
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
  // An input norm goes into the streamed decode kernels; elsewhere it runs first, into its scratch.
  const float* norm = nullptr;
  if (a.norm.active()) {
    PD_TRY(validate_input_norm(Device::kCuda, "matmuls", a.x, a.norm));
    PD_ASSIGN_OR_RETURN(const DevVector* nw, vector("matmuls", a.norm.weight));
    if (k == Kernels::kDecode && fuse_norms() && nw->size == a.x.cols && cuda::gemv_multi_streams(g) &&
        reinterpret_cast<uintptr_t>(nw->data) % 16 == 0) {
      norm = nw->data;
    } else {
      MatmulsArgs normed = a;
      PD_ASSIGN_OR_RETURN(normed.x, normalized_input("matmuls", a.x, a.norm));
      normed.norm = {};
      return matmuls(normed);
    }
  }
  sig_.add(OpTag::kMatmuls);
  sig_.add(a.x);
  sig_.add(k);
  sig_.add(a.norm.weight.index);
  sig_.add_f(a.norm.eps);
  for (const MatmulTarget& t : a.targets) {
    sig_.add(t.w.index);
    sig_.add(t.out);
  }
  if (k == Kernels::kTensorCores) {
    cuda::MmaJob j;
    j.tile_cols = cuda::mma_tile_cols(g.m[0], nullptr);
    for (size_t i = 0; i < count; ++i) {
      j.part[i] =
          mma_part(g.m[i], a.x, a.targets[i].out, i == 0 ? 0 : j.part[i - 1].n_tiles_end, j.tile_cols);
    }
    j.parts = static_cast<int>(count);
    return submit_mma(j, "matmuls prefill", end, g.m[0].cols);
  }
  const float* x = static_cast<const float*>(a.x.data);
  const int64_t xs = a.x.stride;
  const int rows = static_cast<int>(a.x.rows);
  if (norm != nullptr) {
    const float eps = a.norm.eps;
    submit([g, x, xs, rows, norm,
            eps](cudaStream_t s) { cuda::launch_gemv_multi_normed(g, x, xs, rows, norm, eps, s); },
           "matmuls + input norm", end, g.m[0].cols);
    return take_error_if_eager();
  }
  submit([g, x, xs, rows](cudaStream_t s) { cuda::launch_gemv_multi(g, x, xs, rows, s); }, "matmuls", end,
         g.m[0].cols);
  return take_error_if_eager();
}

Status CudaBackend::argmax(const ArgmaxArgs& a) {
  PD_TRY(validate_argmax(Device::kCuda, a));
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

Status CudaBackend::sample(const SampleArgs& a) {
  PD_TRY(validate_sample(a, Device::kCuda));
  const bool needs_q = a.rule == SampleRule::kTokenwise || a.rule == SampleRule::kBlock;
  cuda::SampleLaunch l;
  l.rule = static_cast<cuda::SampleRule>(a.rule);
  l.faulty = static_cast<cuda::Faulty>(a.faulty);
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
  l.write_draft = a.write_draft;
  l.bias = static_cast<const float*>(a.bias.data);
  l.history = static_cast<int32_t*>(a.history.data);
  l.commit = a.commit;
  l.control = static_cast<const int64_t*>(a.control.data);
  l.logprobs = a.logprobs;
  l.out = static_cast<int32_t*>(a.out.data);
  PD_ASSIGN_OR_RETURN(l.scratch, scratch(sample_scratch_, cuda::sample_scratch_bytes(l.rows, l.draft_rows,
                                                                                     l.vocab, l.logprobs)));
  sig_.add(OpTag::kSample);
  for (int32_t v : {static_cast<int32_t>(a.rule), a.faulty, a.prior, static_cast<int32_t>(a.write_draft),
                    static_cast<int32_t>(a.commit), a.logprobs, a.target.top_k, a.draft.top_k}) {
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

}  // namespace pd::cuda_impl
