// Fuzz target: encode and decode of arbitrary text (and arbitrary ids) with the bundled tiny coder's
// tokenizer.json, the Qwen tokenizer pipeline (NFC, the PCRE2 pre-tokenizer, byte-level BPE, added tokens).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "puredrive/tokenizer/tokenizer.h"

namespace {

const pd::Tokenizer& tokenizer() {
  static const pd::Tokenizer tok = [] {
    auto t = pd::Tokenizer::load(PD_SOURCE_DIR "/models/tiny-coder");
    if (!t) std::abort();
    return std::move(t).value();
  }();
  return tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const pd::Tokenizer& tok = tokenizer();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (bool special : {false, true}) {
    auto ids = tok.encode(text, special);
    if (ids) (void)tok.decode(*ids, !special);
  }
  // The same bytes as token ids (in and out of range): decode must skip what it does not know.
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 4 <= size; i += 4) {
    int32_t id = 0;
    for (size_t k = 0; k < 4; ++k) id = static_cast<int32_t>((static_cast<uint32_t>(id) << 8) | data[i + k]);
    ids.push_back(id % 200000);
  }
  (void)tok.decode(ids, false);
  (void)tok.decode(ids, true);
  return 0;
}
