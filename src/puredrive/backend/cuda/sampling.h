// The sample op on the GPU (backend.h SampleArgs): launch interface shared by cuda_ops.cpp and the
// kernels (sampling_*.cu). The math is backend/cpu/sampling.h's, reproduced bit for bit: the same scalar
// functions (sampling_math.h), exact integer sums, and kept sets defined by a strict order, so that the
// order in which the GPU reduces never shows in the result.
//
// One call is a fixed sequence of kernels with device-side parameters and no host synchronisation, so a
// step that contains it can be captured in a CUDA graph. Per processed row (the R target rows, then the k
// draft rows of kTokenwise / kBlock):
//   prep     penalised logits on the fly (bias, history + drafts), argmax, NaN / +inf checks;
//   weights  w = exp((z - z_max) / T) into scratch, min_p, count and exact mass, first radix digit;
//   select   top_k / top_p by radix selection over the key (w desc, id asc): histograms of count and mass
//            per 11-bit digit, then the few candidates left are gathered and sorted in one block; a few
//            grid-wide passes (none on rows of at most 16K tokens), then one block per row finishes
//            whatever is left;
// then the rule: seeded scores, the block rule's residual masses Z_i, one thread deciding a, and one
// inverse-CDF draw over the vocabulary; logprobs when asked; finish writes the output words (in the
// decision's launch for greedy and seeded calls without logprobs). A seeded call on a small vocabulary is
// six launches (with top_p or top_k), a greedy one three.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace pd::cuda {

// backend.h SampleParams (backend.h needs C++20; the kernels are C++17).
struct SampleRowParams {
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float presence = 0.0f;
  float frequency = 0.0f;
  float repetition = 1.0f;
};

// backend.h SampleRule (kBlockwise: its kBlock, a name kernels.h takes), and the deliberately wrong variants
// the exactness tests use (backend/cpu/sampling.h kFaulty*); cuda_ops.cpp checks that the values agree.
enum class SampleRule : int32_t { kGreedy = 0, kTokenwise = 1, kBlockwise = 2, kSeeded = 3 };
enum class Faulty : int32_t { kNone = 0, kBlockUncapped = 1, kBlockFirstFailure = 2, kTokenwiseResample = 3 };

struct SampleLaunch {
  SampleRule rule = SampleRule::kGreedy;
  Faulty faulty = Faulty::kNone;
  SampleRowParams target, draft;
  const float* logits = nullptr;  // [rows, vocab]
  int64_t logits_stride = 0;
  const float* draft_logits = nullptr;  // [draft_rows, vocab]
  int64_t draft_stride = 0;
  int32_t* drafts = nullptr;  // [prior + rows - 1 (+ 1 with write_draft)]
  int prior = 0;
  bool write_draft = false;
  const float* bias = nullptr;  // [vocab] or null
  int32_t* history = nullptr;   // [vocab] or null
  bool commit = false;
  const int64_t* control = nullptr;  // backend.h kSampleControlWords
  int logprobs = -1;
  int32_t* out = nullptr;  // backend.h sample_out_words(rows, logprobs)
  int rows = 0;            // R = k + 1
  int draft_rows = 0;      // k for kTokenwise / kBlock, else 0
  int vocab = 0;
  void* scratch = nullptr;  // sample_scratch_bytes
};

int64_t sample_scratch_bytes(int rows, int draft_rows, int vocab, int logprobs);
void launch_sample(const SampleLaunch& s, cudaStream_t stream);

}  // namespace pd::cuda
