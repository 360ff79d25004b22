// What `puredrive inspect` reports: architecture, layer plan, tensors and formats, parameter counts, the
// memory plan at a context size and the bytes one decode token moves. Built here (not in the CLI) so tests
// can check the numbers the command prints.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "puredrive/model/loader.h"
#include "puredrive/model/memory_plan.h"
#include "puredrive/model/model_config.h"

namespace pd {

struct InspectInput {
  std::string dir;
  const ModelConfig* config = nullptr;     // required
  const Checkpoint* checkpoint = nullptr;  // null: config-only directory
  int64_t ctx_size = 4096;
};

nlohmann::json inspect_json(const InspectInput& in);
std::string inspect_text(const InspectInput& in);

}  // namespace pd
