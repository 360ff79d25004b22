// Reads tokenizer.json with a SAX parser: the vocabulary and merges (two 151K-entry containers) go
// straight into flat lists instead of a JSON DOM, the rest (normalizer, pre-tokenizer, ...) becomes a
// small DOM. This keeps loading Qwen's tokenizer well under a second.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "puredrive/util/status.h"

namespace pd::tok {

struct TokenizerJson {
  nlohmann::json root;  // everything except model.vocab and model.merges
  bool has_vocab = false;
  std::vector<std::pair<std::string, int64_t>> vocab;  // model.vocab in file order
  bool has_merges = false;
  // model.merges as pairs, whichever of the two forms ("a b" or ["a", "b"]) the file uses.
  std::vector<std::pair<std::string, std::string>> merges;
};

// Errors name `source` and the offending entry.
Expected<TokenizerJson> parse_tokenizer_json(std::string_view text, const std::string& source);

}  // namespace pd::tok
