// The generation defaults a model directory declares: end-of-sequence ids and the sampling settings of
// generation_config.json, the way transformers' GenerationConfig and vLLM read them.
//
// EOS ids: generation_config.json "eos_token_id" (an int or a list); when that file or key is absent,
// config.json's (top level, else text_config), as transformers derives a GenerationConfig from the model
// config; plus the tokenizer's eos_token (tokenizer_config.json), which vLLM also stops on.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "puredrive/decode/sampling_params.h"
#include "puredrive/tokenizer/tokenizer.h"
#include "puredrive/util/status.h"

namespace pd {

struct GenerationDefaults {
  std::vector<int32_t> eos_token_ids;  // sorted, unique
  // generation_config.json sampling keys; do_sample = false means greedy (temperature 0).
  std::optional<bool> do_sample;
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int32_t> top_k;
  std::optional<float> min_p;
  std::optional<float> repetition_penalty;

  // The defaults applied to SamplingParams{} (greedy when do_sample is false or absent with no temperature).
  SamplingParams sampling() const;
};

// tokenizer may be null (no tokenizer.json). Malformed JSON or ids of the wrong type are errors naming the
// file and the key; absent files are not.
Expected<GenerationDefaults> load_generation_defaults(const std::string& model_dir,
                                                      const Tokenizer* tokenizer);

}  // namespace pd
