// The BPE model of tokenizer.json: vocabulary, ranked merges, and the merge loop of HF tokenizers
// (repeatedly merge the adjacent pair of lowest rank, leftmost first), with a per-word cache.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "puredrive/tokenizer/flat_map.h"
#include "puredrive/util/status.h"

namespace pd::tok {

struct TokenizerJson;

class BpeModel {
 public:
  // `file.root["model"]` is the "model" object (type "BPE"); its vocab and merges are in `file`.
  static Expected<std::unique_ptr<BpeModel>> from_json(const TokenizerJson& file, const std::string& where);

  // Appends the ids of one pre-tokenized word. Thread-safe.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string_view> id_to_token(int32_t id) const;  // nullopt for ids outside the vocabulary
  size_t vocab_size() const { return vocab_.size(); }
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }

 private:
  BpeModel() = default;
  void tokenize_uncached(std::string_view word, std::vector<int32_t>& out) const;
  std::optional<int32_t> char_id(std::string_view ch, bool first, bool last) const;

  StringIdMap vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<uint8_t> id_present_;
  MergeMap merges_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::array<int32_t, 256> byte_fallback_ids_{};  // "<0xAB>" tokens, -1 when absent
  // Ids of the single-character tokens U+0000..U+017F, the byte-level alphabet's range (-1: absent).
  std::array<int32_t, 0x180> small_char_ids_{};

  // Direct-mapped cache of short words, sharded by hash so threads rarely contend for a lock. A
  // colliding word replaces the previous occupant (no unbounded growth, no clearing).
  static constexpr size_t kCacheShards = 16;
  static constexpr size_t kCacheSlotsPerShard = 4096;
  static constexpr size_t kMaxCachedWordBytes = 96;
  struct CacheEntry {
    uint64_t hash = 0;
    std::string word;
    std::vector<int32_t> ids;
  };
  struct CacheShard {
    std::mutex mu;
    std::vector<CacheEntry> entries = std::vector<CacheEntry>(kCacheSlotsPerShard);
  };
  mutable std::unique_ptr<std::array<CacheShard, kCacheShards>> cache_ =
      std::make_unique<std::array<CacheShard, kCacheShards>>();
};

}  // namespace pd::tok
