// Fuzz target: tokenizer.json loading (normalizers, pre-tokenizers, the BPE model, added tokens); a
// tokenizer that loads then encodes and decodes a few fixed texts.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "puredrive/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto tok = pd::Tokenizer::from_json(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!tok) return 0;
  for (std::string_view text :
       {"Hello, world!", "def f(x):\n    return x  # caf\xc3\xa9", "<|im_start|>u\n"}) {
    for (bool special : {false, true}) {
      auto ids = tok->encode(text, special);
      if (ids) (void)tok->decode(*ids, special);
    }
  }
  std::vector<int32_t> ids;
  for (int32_t id = -1; id < 300; ++id) ids.push_back(id);
  (void)tok->decode(ids, false);
  return 0;
}
