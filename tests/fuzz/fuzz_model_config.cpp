// Fuzz target: config.json -> ModelConfig (every field and layer-plan check on hostile JSON).
#include <cstddef>
#include <cstdint>
#include <string>

#include "puredrive/model/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto config = pd::parse_model_config(std::string(reinterpret_cast<const char*>(data), size), "fuzz.json");
  if (config) (void)pd::layer_plan_string(*config);
  return 0;
}
