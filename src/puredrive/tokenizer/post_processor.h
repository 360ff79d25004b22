// Post-processors of tokenizer.json ("post_processor"), reduced to what encoding one sequence with
// add_special_tokens needs: the ids put before and after it. ByteLevel only adjusts offsets (nothing
// here); TemplateProcessing, RobertaProcessing, BertProcessing and Sequence add special tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "puredrive/util/status.h"

namespace pd::tok {

struct SpecialTokenWrap {
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;
};

// A JSON null yields an empty wrap.
Expected<SpecialTokenWrap> parse_post_processor(const nlohmann::json& j, const std::string& where);

}  // namespace pd::tok
