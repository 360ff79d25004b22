#include "puredrive/tokenizer/detokenizer.h"

#include "puredrive/tokenizer/utf8.h"

namespace pd {

void StreamingDetokenizer::push(int32_t id, std::string& out) {
  if (skip_special_tokens_ && tokenizer_.is_special(id)) return;
  pending_ += tokenizer_.token_bytes(id);
  const size_t consumed = tok::append_lossy_utf8(pending_, out, /*final=*/false);
  pending_.erase(0, consumed);
}

std::string StreamingDetokenizer::push(int32_t id) {
  std::string out;
  push(id, out);
  return out;
}

std::string StreamingDetokenizer::finish() {
  std::string out;
  tok::append_lossy_utf8(pending_, out, /*final=*/true);
  pending_.clear();
  return out;
}

}  // namespace pd
