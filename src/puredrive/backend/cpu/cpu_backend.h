// The CPU backend: f32 accumulation, AVX2+FMA where the CPU has it (runtime dispatch, same summation order
// either way), a fixed partition of work over a thread pool. Weights stay in the memory-mapped checkpoint and
// are dequantised on the fly.
#pragma once

#include <memory>

#include "puredrive/backend/backend.h"

namespace pd {

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options);

}  // namespace pd
