// Tokenizer: HF `tokenizers`-compatible byte-level BPE loaded from a checkpoint's tokenizer.json (and
// tokenizer_config.json / chat_template.jinja for special tokens and chat templates). encode() and
// decode() give the ids and text of Python's tokenizers.Tokenizer, byte for byte.
//
// Pipeline of encode(): added tokens are cut out of the raw text, the rest is normalized (NFC for
// Qwen), added tokens with normalized=true are cut out of that, pre-tokenizers split the pieces into
// words (regex Split + ByteLevel for Qwen), BPE turns words into ids, the post-processor adds
// special tokens when asked.
//
// A Tokenizer is cheap to copy (shared immutable state) and safe to use from several threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "puredrive/util/status.h"

namespace pd {

namespace tok {
struct TokenizerState;
}

class Tokenizer {
 public:
  // Loads model_dir/tokenizer.json, plus model_dir/tokenizer_config.json and
  // model_dir/chat_template.jinja when present.
  static Expected<Tokenizer> load(const std::string& model_dir);
  // Explicit files; an empty config path means none.
  static Expected<Tokenizer> load_files(const std::string& tokenizer_json_path,
                                        const std::string& tokenizer_config_path = "",
                                        const std::string& chat_template_path = "");
  // From file contents (tests, tools); `source` names them in error messages.
  static Expected<Tokenizer> from_json(std::string_view tokenizer_json,
                                       std::string_view tokenizer_config_json = "",
                                       const std::string& source = "tokenizer.json");

  // Fails (kInvalidArgument) on text that is not valid UTF-8: HF tokenizers only take Unicode strings.
  Expected<std::vector<int32_t>> encode(std::string_view text, bool add_special_tokens = true) const;

  // HF decode: tokens -> bytes (ByteLevel decoder) -> UTF-8 with U+FFFD for invalid sequences. Ids
  // outside the vocabulary are skipped, as HF does.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // The bytes one token stands for in decoded text (empty for unknown ids).
  std::string_view token_bytes(int32_t id) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;

  // Number of distinct tokens, added tokens included (HF get_vocab_size(with_added_tokens=True)).
  size_t vocab_size() const;
  // One past the largest id in use, for sizing per-token tables.
  int32_t id_limit() const;
  // A special added token (skipped by decode(skip_special_tokens=true)).
  bool is_special(int32_t id) const;

  // From tokenizer_config.json (string or AddedToken object); nullopt when absent or null.
  std::optional<int32_t> eos_token_id() const;
  std::optional<int32_t> bos_token_id() const;
  std::optional<int32_t> pad_token_id() const;
  std::optional<int32_t> unk_token_id() const;
  const std::string& eos_token() const;  // empty when absent
  const std::string& bos_token() const;
  const std::string& pad_token() const;
  bool add_bos_token() const;  // tokenizer_config.json add_bos_token (false when absent)
  bool add_eos_token() const;

  // Chat templates by name, raw Jinja source. "default" is chat_template.jinja when the model directory
  // has one, else tokenizer_config.json's chat_template (a string, or the entry named "default" of a
  // list of {name, template}).
  const std::map<std::string, std::string>& chat_templates() const;
  // The named template, or nullptr.
  const std::string* chat_template(const std::string& name = "default") const;

 private:
  explicit Tokenizer(std::shared_ptr<const tok::TokenizerState> state) : state_(std::move(state)) {}
  std::shared_ptr<const tok::TokenizerState> state_;
};

}  // namespace pd
