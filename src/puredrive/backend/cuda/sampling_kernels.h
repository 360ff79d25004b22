// Internal to the sample op's kernels (sampling_select.cu, sampling_accept.cu): the first half of a call,
// launched by launch_sample().
#pragma once

#include <cuda_runtime_api.h>

#include "puredrive/backend/cuda/sampling_common.cuh"

namespace pd::cuda::smp {

// Resets the call's state, then penalised logits and argmax for every processed row; with `weights` the
// weights and their mass too, and with `select` the top_k / top_p selection.
void launch_rows(const SampleLaunch& s, const Layout& L, bool weights, bool select, cudaStream_t stream);

}  // namespace pd::cuda::smp
