#include "puredrive/model/prefix_cache.h"

#include <algorithm>
#include <new>

namespace pd {
namespace {

constexpr int kB = kPrefixBlock;
constexpr uint64_t kRootHash = 0x7072656669782d31ULL;  // the parent of the first block

// splitmix64's finalizer: every input bit reaches every output bit.
uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t chain_hash(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = mix(parent + 0x9e3779b97f4a7c15ULL);
  for (const int32_t t : tokens) h = mix(h ^ static_cast<uint32_t>(t));
  return h;
}

}  // namespace

struct PrefixCache::Payload {
  Block* block = nullptr;
  bool snapshot = false;
  bool placed = false;  // holds memory of `tier` and sits in that tier's LRU set
  Tier tier = kDevice;
  int64_t bytes = 0;
  uint64_t tick = 0;
  Buffer device;
  std::unique_ptr<uint8_t[]> host;
};

struct PrefixCache::Block {
  uint64_t hash = 0;
  Block* parent = nullptr;
  int index = 0;  // positions [index * kB, (index + 1) * kB)
  std::vector<int32_t> tokens;
  std::vector<Block*> children;
  Payload kv;
  std::unique_ptr<Payload> snapshot;  // the state after this block
  bool pinned = false;                // on the chain being stored: its rows stay
};

PrefixCache::PrefixCache(Backend& backend, const CacheSpec& spec, DType kv_dtype, int hidden_size,
                         const PrefixCacheOptions& options)
    : backend_(backend), spec_(spec), kv_dtype_(kv_dtype), hidden_size_(hidden_size), options_(options) {
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    (spec.layers[l] == LayerType::kFullAttention ? attention_layers_ : gdn_layers_)
        .push_back(static_cast<int>(l));
  }
  kv_slots_ = 2 * static_cast<int>(attention_layers_.size()) + (options.mtp ? 2 * spec.mtp_layers : 0);
  kv_row_bytes_ = int64_t{spec.kv_width} * static_cast<int64_t>(dtype_size(kv_dtype));
  kv_bytes_ = int64_t{kv_slots_} * kB * kv_row_bytes_;
  const int64_t gdn_floats = int64_t{spec.conv_kernel - 1} * spec.conv_channels + spec.recurrent_size;
  snapshot_floats_ = static_cast<int64_t>(gdn_layers_.size()) * gdn_floats + (options.mtp ? hidden_size : 0);
  snapshot_bytes_ = snapshot_floats_ * 4;
  stats_.device_budget = options.device_budget;
  stats_.host_budget = options.host_budget;
}

PrefixCache::~PrefixCache() = default;

Expected<std::unique_ptr<PrefixCache>> PrefixCache::create(Backend& backend, const CacheSpec& spec,
                                                           DType kv_dtype, int hidden_size,
                                                           const PrefixCacheOptions& options) {
  if (options.device_budget < 0 || options.host_budget < 0) {
    return make_error(ErrorCode::kInvalidArgument, "prefix cache budgets must be >= 0, got {} and {} bytes",
                      options.device_budget, options.host_budget);
  }
  if (kv_dtype != DType::kBF16 && kv_dtype != DType::kF32) {
    return make_error(ErrorCode::kInvalidArgument, "prefix cache: KV dtype {} (BF16 or F32)",
                      dtype_name(kv_dtype));
  }
  if (hidden_size <= 0) return make_error(ErrorCode::kInvalidArgument, "prefix cache: hidden size 0");
  if (options.mtp && spec.mtp_layers == 0) {
    return make_error(ErrorCode::kInvalidArgument, "prefix cache: MTP rows asked, but the model has no head");
  }
  return std::unique_ptr<PrefixCache>(new PrefixCache(backend, spec, kv_dtype, hidden_size, options));
}

// ---- The chain ----

PrefixCache::Block* PrefixCache::find(uint64_t hash, const Block* parent,
                                      std::span<const int32_t> tokens) const {
  const auto [lo, hi] = blocks_.equal_range(hash);
  for (auto it = lo; it != hi; ++it) {
    Block* b = it->second.get();
    if (b->parent == parent && std::equal(tokens.begin(), tokens.end(), b->tokens.begin(), b->tokens.end())) {
      return b;
    }
  }
  return nullptr;
}

std::vector<PrefixCache::Block*> PrefixCache::path(std::span<const int32_t> tokens, int blocks) const {
  std::vector<Block*> out;
  uint64_t h = kRootHash;
  Block* parent = nullptr;
  for (int j = 0; j < blocks && static_cast<size_t>(j + 1) * kB <= tokens.size(); ++j) {
    const std::span<const int32_t> t = tokens.subspan(static_cast<size_t>(j) * kB, kB);
    h = chain_hash(h, t);
    parent = find(h, parent, t);
    if (parent == nullptr) break;
    out.push_back(parent);
  }
  return out;
}

PrefixMatch PrefixCache::lookup(std::span<const int32_t> tokens) {
  PrefixMatch m;
  const std::vector<Block*> p = path(tokens, static_cast<int>(tokens.size() / kB));
  for (size_t j = 0; j < p.size(); ++j) {
    m.matched = static_cast<int>(j + 1) * kB;
    if (p[j]->snapshot) m.resume = m.matched;
  }
  ++stats_.lookups;
  if (m.resume > 0) {
    ++stats_.hits;
    stats_.hit_tokens += m.resume;
  }
  return m;
}

Expected<Tensor> PrefixCache::restore(SequenceState& state, std::span<const int32_t> tokens, int length) {
  const std::vector<Block*> p = path(tokens, length / kB);
  if (length <= 0 || length % kB != 0 || static_cast<int>(p.size()) * kB != length || !p.back()->snapshot) {
    return make_error(ErrorCode::kInvalidArgument, "prefix cache: no snapshot after the first {} tokens",
                      length);
  }
  if (length > state.capacity()) {
    return make_error(ErrorCode::kInvalidArgument, "prefix cache: {} tokens exceed the context of {}", length,
                      state.capacity());
  }
  PD_TRY(check_state(state));
  // Every block and the snapshot in one copy_many: a long hit is thousands of slices (docs/DESIGN.md §4.8).
  std::vector<CopyRegion> copies;
  for (size_t j = 0; j < p.size(); ++j) block_copies(p[j]->kv, state, static_cast<int>(j), true, copies);
  const Payload& snapshot = *p.back()->snapshot;
  Tensor hidden;  // where the snapshot's hidden row is, or lands (host tier)
  if (options_.mtp && snapshot.tier == kDevice) {
    hidden = snapshot.device.tensor().col_slice(snapshot_floats_ - hidden_size_, hidden_size_);
  } else if (options_.mtp) {
    if (hidden_.empty()) {
      PD_ASSIGN_OR_RETURN(hidden_, backend_.alloc(DType::kF32, 1, hidden_size_));
    }
    hidden = hidden_.tensor();
  }
  snapshot_copies(snapshot, state, snapshot.tier == kDevice ? Tensor{} : hidden, true, copies);
  PD_TRY(backend_.copy_many(copies));
  PD_TRY(state.resume_at(length, options_.mtp ? length - 1 : 0));
  touch(p, p.back()->snapshot.get());
  return hidden;
}

Status PrefixCache::store(const SequenceState& state, std::span<const int32_t> tokens, int end,
                          const Tensor& hidden) {
  if (end <= 0 || end % kB != 0 || end != state.length() || static_cast<int>(tokens.size()) < end) {
    return make_error(ErrorCode::kInvalidArgument,
                      "prefix cache: store of {} tokens (a multiple of {}) from a state of {} and {} tokens",
                      end, kB, state.length(), tokens.size());
  }
  if (options_.mtp) {
    if (state.mtp_length() < end - 1) {
      return make_error(ErrorCode::kInternal, "prefix cache: the MTP head holds {} rows, {} needed",
                        state.mtp_length(), end - 1);
    }
    if (hidden.dtype != DType::kF32 || hidden.rows != 1 || hidden.cols != hidden_size_) {
      return make_error(ErrorCode::kInvalidArgument, "prefix cache: hidden is [{}, {}], expected [1, {}] F32",
                        hidden.rows, hidden.cols, hidden_size_);
    }
  }
  PD_TRY(check_state(state));
  std::vector<Block*> chain;
  // The payloads placed below are filled by one copy_many at the end, which must also run on an early return:
  // a placed block holds no rows until then.
  std::vector<CopyRegion> copies;
  auto copy_then = [&](Status s) {
    Status c = copies.empty() ? Status::ok() : backend_.copy_many(copies);
    return s.is_ok() ? std::move(c) : std::move(s);
  };
  // Chain blocks keep their rows while later ones find room; unpinned whatever way this returns.
  struct Unpin {
    std::vector<Block*>& chain;
    ~Unpin() {
      for (Block* b : chain) b->pinned = false;
    }
  } unpin{chain};
  uint64_t h = kRootHash;
  Block* parent = nullptr;
  const int n = end / kB;
  for (int j = 0; j < n; ++j) {
    const std::span<const int32_t> t = tokens.subspan(static_cast<size_t>(j) * kB, kB);
    h = chain_hash(h, t);
    Block* b = find(h, parent, t);
    if (b == nullptr) {
      auto owned = std::make_unique<Block>();
      b = owned.get();
      b->hash = h;
      b->parent = parent;
      b->index = j;
      b->tokens.assign(t.begin(), t.end());
      b->kv.block = b;
      const Expected<bool> placed = place(b->kv, kv_bytes_, true);
      if (!placed.has_value()) return copy_then(placed.status());
      if (!*placed) break;
      blocks_.emplace(h, std::move(owned));
      if (parent != nullptr) parent->children.push_back(b);
      ++stats_.blocks;
      stats_.stored_bytes += kv_bytes_;
      b->pinned = true;
      chain.push_back(b);
      block_copies(b->kv, state, j, false, copies);
    } else {
      b->pinned = true;
      chain.push_back(b);
    }
    parent = b;
  }
  Payload* snapshot = nullptr;
  if (static_cast<int>(chain.size()) == n) {
    Block* last = chain.back();
    if (!last->snapshot) {
      auto s = std::make_unique<Payload>();
      s->block = last;
      s->snapshot = true;
      const Expected<bool> placed = place(*s, snapshot_bytes_, false);
      if (!placed.has_value()) return copy_then(placed.status());
      if (*placed) {
        last->snapshot = std::move(s);
        ++stats_.snapshots;
        stats_.stored_bytes += snapshot_bytes_;
        snapshot_copies(*last->snapshot, state, hidden, false, copies);
      }
    }
    snapshot = last->snapshot.get();
  }
  PD_TRY(copy_then(Status::ok()));
  touch(chain, snapshot);
  for (Block* b : chain) b->pinned = false;
  // A chain that could not be finished ends without a snapshot: its new tail is of no use.
  if (!chain.empty()) prune(chain.back());
  return Status::ok();
}

// ---- Memory ----

Expected<bool> PrefixCache::place(Payload& p, int64_t bytes, bool kv) {
  p.bytes = bytes;
  if (bytes <= options_.device_budget && make_room(kDevice, bytes)) {
    Expected<Buffer> buf = Buffer{};
    if (bytes > 0) {
      buf = kv ? backend_.alloc(kv_dtype_, int64_t{kv_slots_} * kB, spec_.kv_width)
               : backend_.alloc(DType::kF32, 1, snapshot_floats_);
    }
    if (buf) {
      p.device = std::move(*buf);
      p.tier = kDevice;
      p.placed = true;
      stats_.device_bytes += bytes;
      set_tick(p);
      return true;
    }
    // The device has less free memory than the budget allows: host memory may still take it.
    if (buf.status().code() != ErrorCode::kOutOfMemory) return buf.status();
  }
  if (bytes <= options_.host_budget && make_room(kHost, bytes)) {
    p.host.reset(new (std::nothrow) uint8_t[static_cast<size_t>(std::max<int64_t>(bytes, 1))]);
    if (!p.host) return false;
    p.tier = kHost;
    p.placed = true;
    stats_.host_bytes += bytes;
    set_tick(p);
    return true;
  }
  return false;
}

bool PrefixCache::make_room(Tier tier, int64_t bytes) {
  const int64_t budget = tier == kDevice ? options_.device_budget : options_.host_budget;
  const int64_t& used = tier == kDevice ? stats_.device_bytes : stats_.host_bytes;
  if (bytes > budget) return false;
  while (used + bytes > budget) {
    Payload* victim = nullptr;
    for (const auto& [tick, p] : lru_[tier]) {
      if (p->snapshot || !p->block->pinned) {
        victim = p;
        break;
      }
    }
    if (victim == nullptr) return false;
    if (tier == kDevice && victim->bytes <= options_.host_budget) {
      // Room in host memory must not cost the victim's own chain, whose rows it needs.
      std::vector<Block*> pinned_here;
      for (Block* a = victim->block; a != nullptr; a = a->parent) {
        if (!a->pinned) {
          a->pinned = true;
          pinned_here.push_back(a);
        }
      }
      const bool room = make_room(kHost, victim->bytes);
      for (Block* a : pinned_here) a->pinned = false;
      // Host evictions may have taken the blocks below the victim's, whose rows are then of no use.
      Block* b = victim->block;
      if (!b->pinned && !b->snapshot && b->children.empty()) {
        prune(b);
        continue;
      }
      if (room && demote(*victim).is_ok()) continue;
    }
    drop(*victim);
  }
  return true;
}

Status PrefixCache::demote(Payload& p) {
  auto host = std::unique_ptr<uint8_t[]>(new (std::nothrow)
                                             uint8_t[static_cast<size_t>(std::max<int64_t>(p.bytes, 1))]);
  if (!host) return make_error(ErrorCode::kOutOfMemory, "prefix cache: no host memory for {} bytes", p.bytes);
  if (p.bytes > 0) PD_TRY(backend_.download(host.get(), p.device.tensor()));
  lru_[kDevice].erase({p.tick, &p});
  stats_.device_bytes -= p.bytes;
  p.device = Buffer{};
  p.host = std::move(host);
  p.tier = kHost;
  stats_.host_bytes += p.bytes;
  lru_[kHost].insert({p.tick, &p});
  ++stats_.demotions;
  return Status::ok();
}

void PrefixCache::release(Payload& p) {
  if (!p.placed) return;
  lru_[p.tier].erase({p.tick, &p});
  (p.tier == kDevice ? stats_.device_bytes : stats_.host_bytes) -= p.bytes;
  p.device = Buffer{};
  p.host.reset();
  p.placed = false;
  ++stats_.evictions;
}

void PrefixCache::drop(Payload& p) {
  Block* b = p.block;
  if (p.snapshot) {
    release(p);
    b->snapshot.reset();
    --stats_.snapshots;
    prune(b);
    return;
  }
  Block* parent = b->parent;
  remove_subtree(b);
  prune(parent);
}

void PrefixCache::remove_subtree(Block* b) {
  while (!b->children.empty()) remove_subtree(b->children.back());
  release(b->kv);
  if (b->snapshot) {
    release(*b->snapshot);
    --stats_.snapshots;
  }
  if (b->parent != nullptr) std::erase(b->parent->children, b);
  const auto [lo, hi] = blocks_.equal_range(b->hash);
  for (auto it = lo; it != hi; ++it) {
    if (it->second.get() == b) {
      blocks_.erase(it);
      break;
    }
  }
  --stats_.blocks;
}

void PrefixCache::prune(Block* b) {
  while (b != nullptr && !b->pinned && !b->snapshot && b->children.empty()) {
    Block* parent = b->parent;
    remove_subtree(b);
    b = parent;
  }
}

// A path's payloads are used together: the snapshot becomes older than the rows it needs, and each block
// older than its parent, so eviction takes a chain from its end and a shared prefix last.
void PrefixCache::touch(std::span<Block* const> path, Payload* snapshot) {
  if (snapshot != nullptr) set_tick(*snapshot);
  for (auto it = path.rbegin(); it != path.rend(); ++it) set_tick((*it)->kv);
}

void PrefixCache::set_tick(Payload& p) {
  if (!p.placed) return;
  lru_[p.tier].erase({p.tick, &p});
  p.tick = ++tick_;
  lru_[p.tier].insert({p.tick, &p});
}

// ---- Copies ----

namespace {

// The copy of `bytes` between byte `at` of a payload and byte `offset` of a state tensor, either way.
CopyRegion between(const Tensor& payload, int64_t at, const Tensor& state, int64_t offset, int64_t bytes,
                   bool to_state) {
  if (to_state) return {.dst = state, .dst_offset = offset, .src = payload, .src_offset = at, .bytes = bytes};
  return {.dst = payload, .dst_offset = at, .src = state, .src_offset = offset, .bytes = bytes};
}

}  // namespace

Tensor PrefixCache::memory(const Payload& p) const {
  if (p.tier == kDevice) return p.device.tensor();
  return Tensor{.data = p.host.get(),
                .dtype = DType::kU8,
                .rows = 1,
                .cols = p.bytes,
                .stride = p.bytes,
                .device = Device::kCpu};
}

// The copies index byte ranges of whole state tensors: the layout they assume is checked once per call.
Status PrefixCache::check_state(const SequenceState& st) const {
  auto kv = [&](const KvCache& c) {
    for (const Tensor* t : {&c.k, &c.v}) {
      if (t->dtype != kv_dtype_ || t->cols != spec_.kv_width || !t->contiguous()) {
        return make_error(
            ErrorCode::kInvalidArgument,
            "prefix cache: a KV cache of [{}, {}] {} (stride {}); expected contiguous [T, {}] {}", t->rows,
            t->cols, dtype_name(t->dtype), t->stride, spec_.kv_width, dtype_name(kv_dtype_));
      }
    }
    return Status::ok();
  };
  for (const int l : attention_layers_) PD_TRY(kv(st.kv(l)));
  if (options_.mtp) {
    for (int m = 0; m < spec_.mtp_layers; ++m) PD_TRY(kv(st.mtp_kv(m)));
  }
  int64_t floats = options_.mtp ? hidden_size_ : 0;
  for (const int l : gdn_layers_) {
    const GdnState g = st.gdn(l);
    for (const Tensor* t : {&g.conv, &g.recurrent}) {
      if (t->dtype != DType::kF32 || !t->contiguous()) {
        return make_error(ErrorCode::kInvalidArgument,
                          "prefix cache: a GDN state of {} (stride {} for {} columns)", dtype_name(t->dtype),
                          t->stride, t->cols);
      }
      floats += t->numel();
    }
  }
  if (floats != snapshot_floats_) {
    return make_error(ErrorCode::kInvalidArgument, "prefix cache: GDN states of {} floats, expected {}",
                      floats, snapshot_floats_);
  }
  return Status::ok();
}

// Slot s of a block's payload holds kB rows: the block's K or V rows of one layer. The MTP head's slots hold
// its rows index * kB - 1 .. index * kB + kB - 2 (row 0 of the first block's slot stays unused).
void PrefixCache::block_copies(const Payload& p, const SequenceState& st, int index, bool to_state,
                               std::vector<CopyRegion>& out) const {
  const Tensor payload = memory(p);
  int64_t slot = 0;
  auto rows = [&](const Tensor& t, int64_t first, int r0) {
    out.push_back(between(payload, (slot++ * kB + r0) * kv_row_bytes_, t, first * kv_row_bytes_,
                          (kB - r0) * kv_row_bytes_, to_state));
  };
  for (const int l : attention_layers_) {
    rows(st.kv(l).k, int64_t{index} * kB, 0);
    rows(st.kv(l).v, int64_t{index} * kB, 0);
  }
  if (!options_.mtp) return;
  const int r0 = index == 0 ? 1 : 0;
  for (int m = 0; m < spec_.mtp_layers; ++m) {
    rows(st.mtp_kv(m).k, int64_t{index} * kB - 1 + r0, r0);
    rows(st.mtp_kv(m).v, int64_t{index} * kB - 1 + r0, r0);
  }
}

// A snapshot is one F32 row: per GDN layer the conv window then the recurrent state, then the hidden row.
void PrefixCache::snapshot_copies(const Payload& p, const SequenceState& st, const Tensor& hidden,
                                  bool to_state, std::vector<CopyRegion>& out) const {
  const Tensor payload = memory(p);
  int64_t at = 0;
  auto put = [&](const Tensor& t) {
    out.push_back(between(payload, at, t, 0, t.nbytes(), to_state));
    at += t.nbytes();
  };
  for (const int l : gdn_layers_) {
    put(st.gdn(l).conv);
    put(st.gdn(l).recurrent);
  }
  if (options_.mtp && !hidden.empty()) put(hidden);
}

// ---- Tests ----

Status PrefixCache::check() const {
  int64_t bytes[2] = {0, 0};
  size_t placed[2] = {0, 0};
  int64_t snapshots = 0;
  auto count = [&](const Payload& p) -> Status {
    if (!p.placed) return make_error(ErrorCode::kInternal, "a block or snapshot without memory");
    bytes[p.tier] += p.bytes;
    ++placed[p.tier];
    if (!lru_[p.tier].contains({p.tick, const_cast<Payload*>(&p)})) {
      return make_error(ErrorCode::kInternal, "a payload missing from its LRU list");
    }
    return Status::ok();
  };
  for (const auto& [hash, b] : blocks_) {
    if (b->hash != hash || b->pinned) return make_error(ErrorCode::kInternal, "block hash or pin");
    if (b->parent != nullptr) {
      const auto& siblings = b->parent->children;
      if (std::find(siblings.begin(), siblings.end(), b.get()) == siblings.end() ||
          b->index != b->parent->index + 1 || chain_hash(b->parent->hash, b->tokens) != b->hash) {
        return make_error(ErrorCode::kInternal, "block {} is not its parent's child", b->index);
      }
    } else if (b->index != 0 || chain_hash(kRootHash, b->tokens) != b->hash) {
      return make_error(ErrorCode::kInternal, "a root block at index {}", b->index);
    }
    if (b->children.empty() && !b->snapshot) {
      return make_error(ErrorCode::kInternal, "leaf block {} has no snapshot", b->index);
    }
    PD_TRY(count(b->kv));
    if (b->snapshot) {
      PD_TRY(count(*b->snapshot));
      ++snapshots;
    }
  }
  if (bytes[kDevice] != stats_.device_bytes || bytes[kHost] != stats_.host_bytes ||
      placed[kDevice] != lru_[kDevice].size() || placed[kHost] != lru_[kHost].size() ||
      snapshots != stats_.snapshots || static_cast<int64_t>(blocks_.size()) != stats_.blocks) {
    return make_error(ErrorCode::kInternal, "prefix cache accounting: {} / {} bytes, {} blocks, {} snapshots",
                      bytes[kDevice], bytes[kHost], blocks_.size(), snapshots);
  }
  if (stats_.device_bytes > options_.device_budget || stats_.host_bytes > options_.host_budget) {
    return make_error(ErrorCode::kInternal, "prefix cache over budget: {} of {} and {} of {} bytes",
                      stats_.device_bytes, options_.device_budget, stats_.host_bytes, options_.host_budget);
  }
  return Status::ok();
}

}  // namespace pd
