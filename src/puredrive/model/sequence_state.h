// SequenceState: everything one sequence carries between steps, in backend memory: a KV cache per
// full-attention layer, a conv window and an fp32 recurrent state per GDN layer, per-row GDN snapshots of
// the last multi-row step (for speculative rollback, docs/DESIGN.md §4.2) and the MTP head's own KV caches.
//
// Lengths: length() tokens are committed in the main model (positions [0, length)). KV entries at or past
// length() are dead and get overwritten by later steps, so truncating KV is pure bookkeeping. GDN states
// cannot be truncated; rewind() restores the snapshot taken after the kept row of the last step.
#pragma once

#include <cstdint>
#include <vector>

#include "puredrive/backend/backend.h"
#include "puredrive/model/model_config.h"

namespace pd {

// What state each layer needs (an architecture's CacheSpec, docs/ARCHITECTURE.md).
struct CacheSpec {
  std::vector<LayerType> layers;  // one per decoder layer
  int kv_width = 0;               // Hkv * D per K (and per V) entry
  int conv_channels = 0;          // C
  int conv_kernel = 0;            // Kc
  int recurrent_heads = 0;        // Hv
  int recurrent_size = 0;         // Hv * Dk * Dv floats
  int mtp_layers = 0;             // full-attention layers of the MTP head (0: no MTP head)
};

struct StateOptions {
  int ctx_size = 4096;            // KV capacity in tokens (main model and MTP head)
  DType kv_dtype = DType::kBF16;  // kBF16 or kF32
  int max_rows = 8;               // widest step whose per-row GDN snapshots are kept (verify width)
};

class SequenceState {
 public:
  // Allocates every cache in backend memory (zeroed); refuses a plan that does not fit (kOutOfMemory).
  static Expected<SequenceState> create(Backend& backend, const CacheSpec& spec, const StateOptions& options);
  // Bytes create() would allocate.
  static int64_t plan_bytes(const CacheSpec& spec, const StateOptions& options);

  SequenceState(SequenceState&&) = default;
  SequenceState& operator=(SequenceState&&) = default;

  int length() const { return length_; }
  int capacity() const { return options_.ctx_size; }
  int max_rows() const { return options_.max_rows; }
  DType kv_dtype() const { return options_.kv_dtype; }
  // Positions [0, mtp_length) of the MTP head's KV cache hold entries of this sequence.
  int mtp_length() const { return mtp_length_; }
  int64_t nbytes() const;

  // Keeps the first new_length tokens. Allowed when new_length == length(), or when it lies within the rows
  // of the last multi-row step (step_begin < new_length <= length()): the GDN states become that row's
  // snapshot. Models without GDN layers can rewind to any shorter length. The MTP length is clamped to
  // new_length.
  Status rewind(int new_length);
  // Drops MTP KV entries at positions >= n (bookkeeping only).
  void truncate_mtp(int n);
  // An empty sequence: length 0, GDN states zeroed.
  Status reset();
  // A sequence whose caches were filled from outside for positions [0, length) (a prefix-cache hit,
  // model/prefix_cache.h): KV rows, GDN states after `length`, and the MTP head's rows [0, mtp_length).
  // It continues at `length`; there is no step to rewind into.
  Status resume_at(int length, int mtp_length);

  // ---- For model code ----
  const CacheSpec& spec() const { return spec_; }
  KvCache kv(int layer) const;              // full-attention layer
  GdnState gdn(int layer) const;            // GDN layer
  GdnSnapshots snapshots(int layer) const;  // GDN layer
  KvCache mtp_kv(int mtp_layer) const;
  // Records a committed step of `rows` rows starting at length(); snapshots_taken says whether per-row GDN
  // snapshots were written.
  void commit_step(int rows, bool snapshots_taken);
  void commit_mtp(int begin, int rows) { mtp_length_ = begin + rows; }

 private:
  SequenceState() = default;

  Backend* backend_ = nullptr;
  CacheSpec spec_;
  StateOptions options_;
  struct LayerState {
    Buffer k, v;                                 // full attention
    Buffer conv, recurrent;                      // GDN
    Buffer conv_snapshots, recurrent_snapshots;  // GDN, [max_rows, ...]
  };
  std::vector<LayerState> layers_;
  std::vector<LayerState> mtp_layers_;
  int length_ = 0;
  int mtp_length_ = 0;
  // The last step: rows [step_begin_, step_begin_ + step_rows_) with snapshots when step_snapshots_.
  int step_begin_ = 0;
  int step_rows_ = 0;
  bool step_snapshots_ = false;
};

}  // namespace pd
