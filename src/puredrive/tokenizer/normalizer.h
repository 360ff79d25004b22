// Normalizers of tokenizer.json ("normalizer" field): NFC/NFD/NFKC/NFKD (utf8proc), Strip, Prepend,
// Replace and Sequence, with HF tokenizers' semantics. Anything else is rejected when loading.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "puredrive/util/status.h"

namespace pd::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // `s` is valid UTF-8 and stays so.
  virtual Status normalize(std::string& s) const = 0;
};

// `where` names the JSON location for messages ("tokenizer.json: normalizer"). A JSON null yields
// nullptr (no normalization).
Expected<std::unique_ptr<Normalizer>> parse_normalizer(const nlohmann::json& j, const std::string& where);

}  // namespace pd::tok
