#include "puredrive/model/model.h"

#include "puredrive/model/qwen3_5_moe.h"

namespace pd {

Expected<std::unique_ptr<Model>> create_model(const ModelConfig& config, const ModelWeights& weights,
                                              Backend& backend, const ModelOptions& options) {
  // One line per architecture; qwen3_next shares the qwen3_5_moe forward (the loader normalises its layout).
  switch (config.arch) {
    case Arch::kQwen3_5Moe:
    case Arch::kQwen3Next:
      return create_qwen3_5_moe(config, weights, backend, options);
  }
  return make_error(ErrorCode::kUnsupported, "model_type '{}' is not supported", config.model_type);
}

}  // namespace pd
