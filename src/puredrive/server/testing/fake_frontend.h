// TEST-ONLY frontend for `serve --fake-engine` and the server tests: a byte-level tokenizer (ids 0..255 are
// bytes, 256.. special tokens), a ChatML-like template with Hermes-style tool calls
// ("<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>") and "<think>" reasoning, and the
// matching output parser. It exercises every path of the HTTP layer without a model; the real frontend is
// model_frontend.h.
#pragma once

#include "puredrive/server/frontend.h"

namespace pd::server::fake {

inline constexpr int32_t kImStart = 256;    // <|im_start|>
inline constexpr int32_t kImEnd = 257;      // <|im_end|>
inline constexpr int32_t kEndOfText = 258;  // <|endoftext|>
inline constexpr int32_t kVocabSize = 259;

std::vector<int32_t> encode(std::string_view text);  // specials recognised, everything else bytewise
std::string decode(std::span<const int32_t> ids);    // specials as their text

class FakePromptBuilder final : public PromptBuilder {
 public:
  // Fails like a real template does when there is no user message.
  Expected<PromptTokens> render_chat(const ChatPrompt& prompt) const override;
  Expected<PromptTokens> tokenize(std::string_view text) const override;
  std::string detokenize(std::span<const int32_t> ids) const override { return decode(ids); }
  std::vector<int32_t> stop_token_ids() const override { return {kImEnd, kEndOfText}; }
  int32_t vocab_size() const override { return kVocabSize; }
  size_t max_token_bytes() const override { return std::string_view("<|endoftext|>").size(); }
};

class FakeOutputParser final : public OutputParser {
 public:
  std::unique_ptr<TurnParser> start_turn(const ParseOptions& options,
                                         const PromptTokens& prompt) const override;
  // The whole turn so far; `partial`: more text may follow, hold back what may be the start of a tag.
  static ParsedOutput parse(std::string_view text, bool tools, bool partial);
};

Frontend make_fake_frontend();

}  // namespace pd::server::fake
