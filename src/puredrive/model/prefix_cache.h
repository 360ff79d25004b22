// PrefixCache: what a prompt's prefill leaves behind, kept for later prompts that start with the same tokens
// (docs/DESIGN.md §4.8). Coding agents resend the whole conversation every turn; with the cache a turn
// prefills only what is new.
//
// A prompt is cut into blocks of kPrefixBlock tokens; block j is named by a hash chain (the hash of block j -
// 1's name and block j's tokens) and also keeps its tokens and parent, so that a hash collision can never
// give a wrong hit. A block holds the KV rows of its positions in every full-attention layer and, with an
// MTP head, the head's KV rows that its tokens complete (positions 64j - 1 .. 64j + 62: the head's row p
// reads token p + 1). GDN layers carry a state, not rows, so some block ends also hold a snapshot: the conv
// window and recurrent state of every GDN layer after the block, plus the final-norm hidden state of its
// last position (the head's next row needs it). A prompt resumes at the longest cached prefix that ends in
// a snapshot.
//
// Exactness: blocks end on multiples of 64 positions, where the prefill is chunking invariant (docs/DESIGN.md
// §4.6): the caches and outputs after a hit are bitwise those of a cold prefill. Only prefill steps store
// (decode steps compute other bits), so a request's generated tokens are not cached.
//
// Memory: two budgets, one for backend memory (GPU memory on CUDA; RAM on the CPU backend) and one for host
// memory that takes what the device tier evicts. Least recently used payloads go first: a block's KV rows
// and a snapshot are payloads of their own. Dropping a snapshot drops the blocks left without one at or
// below them; dropping a block's rows drops the blocks below it.
//
// Copies: a restore moves every block's slices and the snapshot with one Backend::copy_many, and a store
// those of the blocks and snapshot it adds: a few launches on a GPU, whatever the number of blocks.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "puredrive/backend/backend.h"
#include "puredrive/model/sequence_state.h"

namespace pd {

// Tokens per block: the unit of chunking invariance (kGdnPrefillChunk), so that every block boundary is one a
// cold prefill may also stop at.
inline constexpr int kPrefixBlock = kGdnPrefillChunk;

struct PrefixCacheOptions {
  int64_t device_budget = 0;  // bytes of backend memory (GPU memory on CUDA, RAM on the CPU backend)
  int64_t host_budget = 0;    // bytes of host memory for payloads evicted from the device; 0: none
  bool mtp = false;           // keep the MTP head's KV rows and the hidden state at each snapshot
};

struct PrefixCacheStats {
  int64_t lookups = 0;
  int64_t hits = 0;        // lookups that resumed from a cached prefix
  int64_t hit_tokens = 0;  // prompt tokens resumed rather than prefilled
  int64_t evictions = 0;   // payloads dropped for room (device or host)
  int64_t demotions = 0;   // payloads moved from the device to host memory for room
  int64_t stored_bytes = 0;
  int64_t device_bytes = 0;  // held now
  int64_t host_bytes = 0;
  int64_t device_budget = 0;
  int64_t host_budget = 0;
  int64_t blocks = 0;
  int64_t snapshots = 0;
  int64_t misses() const { return lookups - hits; }
};

// Where a prompt can resume.
struct PrefixMatch {
  int matched = 0;  // tokens in the longest chain of cached blocks that the prompt starts with
  int resume = 0;   // tokens of the longest such prefix that ends in a snapshot (<= matched)
};

class PrefixCache {
 public:
  // spec and kv_dtype are the generator's state; hidden_size the model's H (the MTP hidden rows).
  static Expected<std::unique_ptr<PrefixCache>> create(Backend& backend, const CacheSpec& spec,
                                                       DType kv_dtype, int hidden_size,
                                                       const PrefixCacheOptions& options);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  bool mtp() const { return options_.mtp; }

  // The longest prefix of `tokens` (whole blocks) that the cache holds. Counts a lookup, and a hit of
  // `resume` tokens when resume > 0.
  PrefixMatch lookup(std::span<const int32_t> tokens);

  // Fills `state` with the first `length` tokens of `tokens` (a PrefixMatch::resume of them): KV rows
  // [0, length) of every attention layer, the MTP head's rows [0, length - 1), the GDN states after `length`;
  // then state.length() is `length`. Returns the final-norm hidden state of position length - 1 (F32 [1, H],
  // valid until the next call), which the head's row length - 1 reads with token `length`; empty without
  // mtp.
  Expected<Tensor> restore(SequenceState& state, std::span<const int32_t> tokens, int length);

  // Stores what the cache lacks of tokens [0, end) from `state`, just prefilled to exactly `end` (a multiple
  // of kPrefixBlock): the missing blocks and a snapshot at `end` with `hidden` (F32 [1, H], the final-norm
  // hidden of position end - 1; needed with mtp, when the head's cache must hold rows [0, end - 1)). What
  // does not fit in the budgets is left out; every prefix stored ends in a snapshot.
  Status store(const SequenceState& state, std::span<const int32_t> tokens, int end, const Tensor& hidden);

  const PrefixCacheStats& stats() const { return stats_; }
  // Bytes of one block's payload and of one snapshot.
  int64_t block_bytes() const { return kv_bytes_; }
  int64_t snapshot_bytes() const { return snapshot_bytes_; }

  // Checks the bookkeeping against the stored payloads (tests): byte counts, budgets, LRU membership, that
  // every block is reachable from a root, and that every leaf block ends in a snapshot.
  Status check() const;

 private:
  struct Block;
  struct Payload;
  enum Tier : int { kDevice = 0, kHost = 1 };

  PrefixCache(Backend& backend, const CacheSpec& spec, DType kv_dtype, int hidden_size,
              const PrefixCacheOptions& options);

  Block* find(uint64_t hash, const Block* parent, std::span<const int32_t> tokens) const;
  std::vector<Block*> path(std::span<const int32_t> tokens, int blocks) const;
  // A payload of `bytes` on the device when it fits, else in host memory; false when neither budget has room
  // for it without evicting a pinned payload.
  Expected<bool> place(Payload& p, int64_t bytes, bool kv);
  bool make_room(Tier tier, int64_t bytes);
  Status demote(Payload& p);
  void drop(Payload& p);
  void remove_subtree(Block* b);
  void prune(Block* b);
  void release(Payload& p);  // frees its memory and leaves the LRU
  void touch(std::span<Block* const> path, Payload* snapshot);
  void set_tick(Payload& p);

  // Copies between state tensors and payloads, appended to `out` for one Backend::copy_many: to the state
  // (to_state, a restore) or from it. A payload's memory is its device buffer or its host bytes.
  Tensor memory(const Payload& p) const;
  Status check_state(const SequenceState& st) const;
  void block_copies(const Payload& p, const SequenceState& st, int index, bool to_state,
                    std::vector<CopyRegion>& out) const;
  // `hidden`: the hidden row's source (store) or destination (restore from host memory); empty: none.
  void snapshot_copies(const Payload& p, const SequenceState& st, const Tensor& hidden, bool to_state,
                       std::vector<CopyRegion>& out) const;

  Backend& backend_;
  CacheSpec spec_;
  DType kv_dtype_;
  int hidden_size_;
  PrefixCacheOptions options_;
  std::vector<int> attention_layers_, gdn_layers_;
  int kv_slots_ = 0;  // KV tensors per block: K and V of every attention layer, then of every MTP layer
  int64_t kv_row_bytes_ = 0, kv_bytes_ = 0, snapshot_floats_ = 0, snapshot_bytes_ = 0;

  std::unordered_multimap<uint64_t, std::unique_ptr<Block>> blocks_;
  std::set<std::pair<uint64_t, Payload*>> lru_[2];  // per tier, least recently used first
  uint64_t tick_ = 0;
  Buffer hidden_;  // the hidden row of a snapshot restored from host memory
  PrefixCacheStats stats_;
};

}  // namespace pd
