#include "puredrive/tokenizer/added_vocabulary.h"

#include <algorithm>

#include "puredrive/tokenizer/normalizer.h"
#include "puredrive/tokenizer/regex.h"
#include "puredrive/tokenizer/utf8.h"

namespace pd::tok {

int32_t TokenTrie::child(int32_t node, uint8_t byte) const {
  for (const auto& [b, n] : nodes_[node].children) {
    if (b == byte) return n;
  }
  return -1;
}

void TokenTrie::add(std::string_view pattern, int32_t value) {
  if (pattern.empty()) return;
  int32_t node = 0;
  for (const char c : pattern) {
    const auto byte = static_cast<uint8_t>(c);
    int32_t next = child(node, byte);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_[node].children.emplace_back(byte, next);
      nodes_.emplace_back();
    }
    node = next;
  }
  if (nodes_[node].value < 0) nodes_[node].value = value;  // the first pattern wins, as in aho-corasick
  first_byte_[static_cast<uint8_t>(pattern[0])] = true;
}

bool TokenTrie::find(std::string_view text, size_t from, size_t& begin, size_t& end, int32_t& value) const {
  for (size_t start = from; start < text.size(); ++start) {
    if (!first_byte_[static_cast<uint8_t>(text[start])]) continue;
    int32_t node = 0;
    int32_t best = -1;
    size_t best_end = 0;
    for (size_t k = start; k < text.size(); ++k) {
      node = child(node, static_cast<uint8_t>(text[k]));
      if (node < 0) break;
      if (nodes_[node].value >= 0) {
        best = nodes_[node].value;
        best_end = k + 1;
      }
    }
    if (best >= 0) {
      begin = start;
      end = best_end;
      value = best;
      return true;
    }
  }
  return false;
}

void AddedVocabulary::build(std::vector<AddedToken> tokens, const Normalizer* normalizer) {
  tokens_ = std::move(tokens);
  raw_trie_ = TokenTrie();
  normalized_trie_ = TokenTrie();
  for (const bool special_pass : {true, false}) {
    for (size_t k = 0; k < tokens_.size(); ++k) {
      const AddedToken& t = tokens_[k];
      if (t.special != special_pass) continue;
      if (!t.normalized) {
        raw_trie_.add(t.content, static_cast<int32_t>(k));
        continue;
      }
      std::string content = t.content;
      if (normalizer != nullptr && !normalizer->normalize(content).is_ok()) content = t.content;
      normalized_trie_.add(content, static_cast<int32_t>(k));
    }
  }
}

namespace {

char32_t last_code_point(std::string_view s) {
  size_t start = s.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  return next_code_point(s, start);
}

}  // namespace

void AddedVocabulary::split(std::string_view text, bool normalized_stage, std::vector<TextPiece>& out) const {
  const TokenTrie& trie = normalized_stage ? normalized_trie_ : raw_trie_;
  if (trie.empty()) {
    out.push_back({0, text.size(), -1});
    return;
  }
  size_t start_offset = 0;
  size_t search_from = 0;
  size_t b = 0, e = 0;
  int32_t index = -1;
  while (trie.find(text, search_from, b, e, index)) {
    search_from = e;
    const AddedToken& t = tokens_[index];
    if (t.single_word) {
      const bool start_space = b == 0 || !is_word_char(last_code_point(text.substr(0, b)));
      size_t after = e;
      const bool stop_space = e == text.size() || !is_word_char(next_code_point(text, after));
      if (!start_space || !stop_space) continue;
    }
    size_t start = b;
    size_t stop = e;
    if (t.lstrip) {
      size_t ws = b;
      while (ws > 0) {
        size_t prev = ws - 1;
        while (prev > 0 && (static_cast<unsigned char>(text[prev]) & 0xC0) == 0x80) --prev;
        size_t tmp = prev;
        if (!is_white_space(next_code_point(text, tmp))) break;
        ws = prev;
      }
      start = std::max(ws, start_offset);
    }
    if (t.rstrip) {
      while (stop < text.size()) {
        size_t next = stop;
        if (!is_white_space(next_code_point(text, next))) break;
        stop = next;
      }
    }
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, t.id});
    start_offset = stop;
  }
  if (start_offset != text.size()) out.push_back({start_offset, text.size(), -1});
}

}  // namespace pd::tok
