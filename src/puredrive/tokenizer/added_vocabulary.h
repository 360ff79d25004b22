// Added tokens (tokenizer.json "added_tokens"), matched in the text before the model sees it, as HF's
// AddedVocabulary does: leftmost-longest matching, first on the raw text for tokens with
// normalized=false, then on each normalized remaining piece for tokens with normalized=true, with the
// single_word / lstrip / rstrip rules.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pd::tok {

class Normalizer;

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
};

// A slice of the text and, when it is an added token, its id.
struct TextPiece {
  size_t begin = 0, end = 0;
  int32_t id = -1;
};

// Leftmost-longest matcher over a set of byte strings.
class TokenTrie {
 public:
  void add(std::string_view pattern, int32_t value);
  // Leftmost-longest match starting at or after `from`; false when none.
  bool find(std::string_view text, size_t from, size_t& begin, size_t& end, int32_t& value) const;
  bool empty() const { return nodes_.size() <= 1; }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // byte -> node index
    int32_t value = -1;
  };
  int32_t child(int32_t node, uint8_t byte) const;
  std::vector<Node> nodes_ = std::vector<Node>(1);
  bool first_byte_[256] = {};
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  // Tokens in tokenizer.json order; normalized tokens are matched in their normalized form. Special
  // tokens take precedence over others with the same content, as HF orders its patterns.
  void build(std::vector<AddedToken> tokens, const Normalizer* normalizer);

  // Splits `text` into added-token pieces and the gaps between them. `normalized_stage` selects the
  // tokens with normalized=true (matched in normalized text) or false (matched in the raw text).
  void split(std::string_view text, bool normalized_stage, std::vector<TextPiece>& out) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  std::vector<AddedToken> tokens_;
  TokenTrie raw_trie_;         // normalized == false
  TokenTrie normalized_trie_;  // normalized == true
};

}  // namespace pd::tok
