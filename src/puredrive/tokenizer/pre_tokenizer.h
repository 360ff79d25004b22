// Pre-tokenizers of tokenizer.json ("pre_tokenizer" field): Split (regex or literal, every
// SplitDelimiterBehavior, invert), ByteLevel and Sequence, with HF tokenizers' semantics.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "puredrive/util/status.h"

namespace pd::tok {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces every piece by its sub-pieces; empty pieces are dropped, as HF drops empty splits.
  virtual Status pre_tokenize(std::vector<std::string>& pieces) const = 0;
};

// A JSON null yields nullptr (the text is one piece).
Expected<std::unique_ptr<PreTokenizer>> parse_pre_tokenizer(const nlohmann::json& j,
                                                            const std::string& where);

}  // namespace pd::tok
