// Open-addressing hash maps for the 151K-entry vocabulary and merge table: keys in one arena, one
// probe sequence over a flat array. std::unordered_map's node per entry made loading and lookups
// cache-miss bound.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace pd::tok {

inline uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (s.size() * 0xFF51AFD7ED558CCDull);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  uint64_t w = 0;
  std::memcpy(&w, s.data() + i, s.size() - i);
  h = (h ^ w) * 0x94D049BB133111EBull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return h;
}

// Transparent hasher for std::unordered_map<std::string, ...> looked up with string_views.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return hash_bytes(s); }
};

// Byte string -> int32 value (values are never negative; -1 means absent).
class StringIdMap {
 public:
  void reserve(size_t n) { rehash(capacity_for(n)); }

  void insert_or_assign(std::string_view key, int32_t value) {
    if ((size_ + 1) * 4 > slots_.size() * 3) rehash(capacity_for(size_ + 1));
    const uint64_t h = hash_bytes(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.value < 0) {
        s = {h, static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(key.size()), value};
        arena_.append(key);
        ++size_;
        return;
      }
      if (s.hash == h && view(s) == key) {
        s.value = value;
        return;
      }
    }
  }

  int32_t find(std::string_view key) const {
    if (slots_.empty()) return -1;
    const uint64_t h = hash_bytes(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.value < 0) return -1;
      if (s.hash == h && view(s) == key) return s.value;
    }
  }

  size_t size() const { return size_; }

  // f(std::string_view key, int32_t value); views stay valid until the next insertion.
  template <typename F>
  void for_each(F&& f) const {
    for (const Slot& s : slots_) {
      if (s.value >= 0) f(view(s), s.value);
    }
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t offset = 0;
    uint32_t length = 0;
    int32_t value = -1;  // -1: empty
  };
  static size_t capacity_for(size_t n) {
    size_t cap = 16;
    while (cap * 3 < n * 4 + 4) cap *= 2;
    return cap;
  }
  std::string_view view(const Slot& s) const { return std::string_view(arena_).substr(s.offset, s.length); }
  void rehash(size_t cap) {
    if (cap <= slots_.size()) return;
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
    for (const Slot& s : old) {
      if (s.value < 0) continue;
      size_t i = s.hash & mask_;
      while (slots_[i].value >= 0) i = (i + 1) & mask_;
      slots_[i] = s;
    }
  }

  std::vector<Slot> slots_;
  std::string arena_;
  size_t size_ = 0;
  size_t mask_ = 0;
};

// (left id, right id) -> (rank, merged id) of the BPE merges.
class MergeMap {
 public:
  struct Target {
    int32_t rank = -1;
    int32_t id = -1;
  };

  void reserve(size_t n) { rehash(capacity_for(n)); }

  // A repeated pair takes the later value, as HF's map construction does.
  void insert_or_assign(int32_t a, int32_t b, Target t) {
    if ((size_ + 1) * 2 > slots_.size()) rehash(capacity_for(size_ + 1));
    const uint64_t k = key(a, b);
    for (size_t i = slot_of(k);; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.key == kEmpty) {
        s = {k, t};
        ++size_;
        return;
      }
      if (s.key == k) {
        s.target = t;
        return;
      }
    }
  }

  // nullptr when the pair has no merge.
  const Target* find(int32_t a, int32_t b) const {
    if (slots_.empty()) return nullptr;
    const uint64_t k = key(a, b);
    for (size_t i = slot_of(k);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == k) return &s.target;
      if (s.key == kEmpty) return nullptr;
    }
  }

  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // ids are non-negative, so never a real key
  struct Slot {
    uint64_t key = kEmpty;
    Target target;
  };
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  size_t slot_of(uint64_t k) const {
    uint64_t h = k * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    return h & mask_;
  }
  static size_t capacity_for(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap *= 2;
    return cap;
  }
  void rehash(size_t cap) {
    if (cap <= slots_.size()) return;
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
    size_ = 0;
    for (const Slot& s : old) {
      if (s.key == kEmpty) continue;
      size_t i = slot_of(s.key);
      while (slots_[i].key != kEmpty) i = (i + 1) & mask_;
      slots_[i] = s;
      ++size_;
    }
  }

  std::vector<Slot> slots_;
  size_t size_ = 0;
  size_t mask_ = 0;
};

}  // namespace pd::tok
