// Checkpoint tensor names: the prefix spellings of HF, mlx-lm and mlx-vlm checkpoints
// (docs/spec/qwen3_5_moe.md §2.1, §9.1) mapped to one canonical form, `model.…`, `lm_head.…` or `mtp.…`.
#pragma once

#include <string>

namespace pd {

struct NamePrefix {
  const char* stored;
  const char* canonical;  // nullptr: vision tower (skipped)
};

// The prefix rule a stored name matches, or null when it fits none.
const NamePrefix* match_name_prefix(const std::string& stored);

// Canonical name of a stored tensor; empty for vision-tower tensors. Names that fit no known prefix are
// returned unchanged (they end up unused).
std::string canonical_tensor_name(const std::string& stored);

// Orders "layers.10" after "layers.9": digit runs compare as numbers.
bool natural_less(const std::string& a, const std::string& b);

}  // namespace pd
