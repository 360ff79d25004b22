#include "puredrive/tokenizer/bpe.h"

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>

#include "puredrive/tokenizer/tokenizer_json.h"
#include "puredrive/tokenizer/utf8.h"

namespace pd::tok {

namespace {

Expected<std::optional<std::string>> optional_string(const nlohmann::json& j, const char* key,
                                                     const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string()) {
    return make_error(ErrorCode::kCorrupt, "{}.{}: expected a string or null, found {}", where, key,
                      it->type_name());
  }
  return std::optional<std::string>(it->get<std::string>());
}

Expected<bool> optional_bool(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return false;
  if (!it->is_boolean()) {
    return make_error(ErrorCode::kCorrupt, "{}.{}: expected a boolean, found {}", where, key,
                      it->type_name());
  }
  return it->get<bool>();
}

}  // namespace

Expected<std::unique_ptr<BpeModel>> BpeModel::from_json(const TokenizerJson& file, const std::string& where) {
  const nlohmann::json& model = file.root.at("model");
  std::unique_ptr<BpeModel> m(new BpeModel());

  const auto dropout = model.find("dropout");
  if (dropout != model.end() && !dropout->is_null()) {
    if (!dropout->is_number()) {
      return make_error(ErrorCode::kCorrupt, "{}.dropout: expected a number or null, found {}", where,
                        dropout->type_name());
    }
    if (dropout->get<double>() > 0.0) {
      return make_error(ErrorCode::kUnsupported,
                        "{}.dropout = {}: BPE dropout (random merges) is not supported", where,
                        dropout->get<double>());
    }
  }
  PD_ASSIGN_OR_RETURN(auto prefix, optional_string(model, "continuing_subword_prefix", where));
  PD_ASSIGN_OR_RETURN(auto suffix, optional_string(model, "end_of_word_suffix", where));
  PD_ASSIGN_OR_RETURN(auto unk, optional_string(model, "unk_token", where));
  PD_ASSIGN_OR_RETURN(m->fuse_unk_, optional_bool(model, "fuse_unk", where));
  PD_ASSIGN_OR_RETURN(m->byte_fallback_, optional_bool(model, "byte_fallback", where));
  PD_ASSIGN_OR_RETURN(m->ignore_merges_, optional_bool(model, "ignore_merges", where));
  m->continuing_subword_prefix_ = prefix.value_or("");
  m->end_of_word_suffix_ = suffix.value_or("");

  if (!file.has_vocab) {
    const auto it = model.find("vocab");
    return make_error(ErrorCode::kCorrupt, "{}.vocab: expected an object mapping tokens to ids, found {}",
                      where, it == model.end() ? "nothing" : it->type_name());
  }
  m->vocab_.reserve(file.vocab.size());
  int64_t max_id = -1;
  for (const auto& [token, id] : file.vocab) {
    m->vocab_.insert_or_assign(token, static_cast<int32_t>(id));  // a repeated key: the last one wins
    max_id = std::max(max_id, id);
  }
  m->id_to_token_.resize(static_cast<size_t>(max_id + 1));
  m->id_present_.assign(static_cast<size_t>(max_id + 1), 0);
  m->vocab_.for_each([&](std::string_view token, int32_t id) {
    // Several tokens sharing an id: like HF's reversed map, one of them wins.
    m->id_to_token_[id] = std::string(token);
    m->id_present_[id] = 1;
  });

  if (unk) {
    const int32_t id = m->vocab_.find(*unk);
    if (id < 0)
      return make_error(ErrorCode::kCorrupt, "{}.unk_token '{}' is not in the vocabulary", where, *unk);
    m->unk_id_ = id;
  }
  for (int b = 0; b < 256; ++b) m->byte_fallback_ids_[b] = m->vocab_.find(fmt::format("<0x{:02X}>", b));
  for (char32_t cp = 0; cp < m->small_char_ids_.size(); ++cp) {
    std::string s;
    append_utf8(s, cp);
    m->small_char_ids_[cp] = m->vocab_.find(s);
  }

  if (!file.has_merges) {
    const auto it = model.find("merges");
    return make_error(ErrorCode::kCorrupt, "{}.merges: expected an array, found {}", where,
                      it == model.end() ? "nothing" : it->type_name());
  }
  m->merges_.reserve(file.merges.size());
  const size_t prefix_len = m->continuing_subword_prefix_.size();
  std::string merged;
  for (size_t rank = 0; rank < file.merges.size(); ++rank) {
    const auto& [a, b] = file.merges[rank];
    const int32_t ia = m->vocab_.find(a);
    const int32_t ib = m->vocab_.find(b);
    if (ia < 0 || ib < 0) {
      return make_error(ErrorCode::kCorrupt, "{}.merges[{}]: token '{}' is not in the vocabulary", where,
                        rank, ia < 0 ? a : b);
    }
    merged.assign(a);
    merged.append(std::string_view(b).substr(std::min(prefix_len, b.size())));
    const int32_t inew = m->vocab_.find(merged);
    if (inew < 0) {
      return make_error(ErrorCode::kCorrupt, "{}.merges[{}]: merged token '{}' is not in the vocabulary",
                        where, rank, merged);
    }
    m->merges_.insert_or_assign(ia, ib, {static_cast<int32_t>(rank), inew});
  }
  return m;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  const int32_t id = vocab_.find(token);
  if (id < 0) return std::nullopt;
  return id;
}

std::optional<std::string_view> BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !id_present_[id]) return std::nullopt;
  return id_to_token_[id];
}

std::optional<int32_t> BpeModel::char_id(std::string_view ch, bool first, bool last) const {
  const bool add_prefix = !first && !continuing_subword_prefix_.empty();
  const bool add_suffix = last && !end_of_word_suffix_.empty();
  if (!add_prefix && !add_suffix) {
    const auto c0 = static_cast<unsigned char>(ch[0]);
    if (ch.size() == 1 || (ch.size() == 2 && c0 < 0xC6)) {  // U+0000..U+017F
      size_t i = 0;
      const char32_t cp = next_code_point(ch, i);
      const int32_t id = small_char_ids_[cp];
      if (id < 0) return std::nullopt;
      return id;
    }
    return token_to_id(ch);
  }
  std::string s;
  if (add_prefix) s = continuing_subword_prefix_;
  s.append(ch);
  if (add_suffix) s.append(end_of_word_suffix_);
  return token_to_id(s);
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = token_to_id(word)) {
      out.push_back(*id);
      return;
    }
  }
  if (word.size() > kMaxCachedWordBytes) {
    tokenize_uncached(word, out);
    return;
  }
  const uint64_t h = hash_bytes(word);
  auto& shard = (*cache_)[h % kCacheShards];
  CacheEntry& entry = shard.entries[(h / kCacheShards) % kCacheSlotsPerShard];
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    if (entry.hash == h && entry.word == word) {
      out.insert(out.end(), entry.ids.begin(), entry.ids.end());
      return;
    }
  }
  const size_t start = out.size();
  tokenize_uncached(word, out);
  std::lock_guard<std::mutex> lock(shard.mu);
  entry.hash = h;
  entry.word.assign(word);
  entry.ids.assign(out.begin() + static_cast<ptrdiff_t>(start), out.end());
}

void BpeModel::tokenize_uncached(std::string_view word, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  // Scratch reused across calls on this thread: most words are a few symbols, allocation would dominate.
  thread_local std::vector<Symbol> symbols;
  symbols.clear();
  auto add = [&](int32_t id) {
    const auto n = static_cast<int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, true});
  };

  // Initial symbols: one per character, with HF's unknown-character handling.
  int32_t pending_unk = -1;  // unknown token waiting to be added (fuse_unk grows it)
  size_t i = 0;
  while (i < word.size()) {
    const size_t begin = i;
    next_code_point(word, i);
    const std::string_view ch = word.substr(begin, i - begin);
    if (auto id = char_id(ch, begin == 0, i == word.size())) {
      if (pending_unk >= 0) {
        add(pending_unk);
        pending_unk = -1;
      }
      add(*id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (const char c : ch) all = all && byte_fallback_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        // HF leaves a pending unknown token pending here (it lands after these bytes).
        for (const char c : ch) add(byte_fallback_ids_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
      pending_unk = *unk_id_;
    }
    // Without an unknown token the character is dropped, as in HF.
  }
  if (pending_unk >= 0) add(pending_unk);

  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
  };
  // Min-heap on (rank, pos): lowest rank first, leftmost among equal ranks.
  auto worse = [](const Candidate& x, const Candidate& y) {
    return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos;
  };
  thread_local std::vector<Candidate> heap;
  heap.clear();
  auto push_pair = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    const MergeMap::Target* t = merges_.find(symbols[pos].id, symbols[next].id);
    if (t == nullptr) return;
    heap.push_back({t->rank, pos, t->id});
    std::push_heap(heap.begin(), heap.end(), worse);
  };
  for (int32_t p = 0; p + 1 < static_cast<int32_t>(symbols.size()); ++p) push_pair(p);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), worse);
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // Stale entry: the pair at this position changed since it was queued.
    const MergeMap::Target* t = merges_.find(left.id, right.id);
    if (t == nullptr || t->id != top.new_id) continue;
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (const auto& s : symbols) {
    if (s.alive) out.push_back(s.id);
  }
}

}  // namespace pd::tok
