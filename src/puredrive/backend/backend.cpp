#include "puredrive/backend/backend.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "puredrive/backend/cpu/cpu_backend.h"

namespace pd {

#ifdef PD_HAVE_CUDA
// Defined by the CUDA backend (src/puredrive/backend/cuda/).
Expected<std::unique_ptr<Backend>> make_cuda_backend(const BackendOptions& options);
#endif

std::vector<std::string> available_backends() {
#ifdef PD_HAVE_CUDA
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

Expected<std::unique_ptr<Backend>> create_backend(const BackendOptions& options) {
  if (options.name == "auto") {
#ifdef PD_HAVE_CUDA
    BackendOptions cuda = options;
    cuda.name = "cuda";
    // The CUDA probe fails cleanly (no driver, no device); only then is the CPU the right choice.
    if (auto b = make_cuda_backend(cuda)) return b;
#endif
    BackendOptions cpu = options;
    cpu.name = "cpu";
    return make_cpu_backend(cpu);
  }
  if (options.name == "cpu") return make_cpu_backend(options);
#ifdef PD_HAVE_CUDA
  if (options.name == "cuda") return make_cuda_backend(options);
#endif
  return make_error(ErrorCode::kUnsupported, "unknown backend '{}'; this build has: auto, {}", options.name,
                    fmt::join(available_backends(), ", "));
}

}  // namespace pd
