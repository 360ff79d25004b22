#include "puredrive/model/sequence_state.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace pd {
namespace {

int64_t kv_bytes(const CacheSpec& spec, const StateOptions& o) {
  return 2 * int64_t{o.ctx_size} * spec.kv_width * static_cast<int64_t>(dtype_size(o.kv_dtype));
}
int64_t conv_floats(const CacheSpec& spec) {
  return int64_t{spec.conv_kernel - 1} * spec.conv_channels;
}

}  // namespace

int64_t SequenceState::plan_bytes(const CacheSpec& spec, const StateOptions& o) {
  int64_t bytes = 0;
  for (LayerType t : spec.layers) {
    if (t == LayerType::kFullAttention) {
      bytes += kv_bytes(spec, o);
    } else {
      bytes += (conv_floats(spec) + spec.recurrent_size) * int64_t{1 + o.max_rows} * 4;
    }
  }
  return bytes + int64_t{spec.mtp_layers} * kv_bytes(spec, o);
}

Expected<SequenceState> SequenceState::create(Backend& backend, const CacheSpec& spec,
                                              const StateOptions& o) {
  if (o.ctx_size <= 0)
    return make_error(ErrorCode::kInvalidArgument, "ctx size must be positive, got {}", o.ctx_size);
  if (o.max_rows <= 0)
    return make_error(ErrorCode::kInvalidArgument, "max rows must be positive, got {}", o.max_rows);
  if (o.kv_dtype != DType::kBF16 && o.kv_dtype != DType::kF32) {
    return make_error(ErrorCode::kInvalidArgument, "KV cache dtype must be BF16 or F32, got {}",
                      dtype_name(o.kv_dtype));
  }
  const int64_t need = plan_bytes(spec, o);
  const int64_t have = backend.available_memory();
  if (need > have) {
    return make_error(
        ErrorCode::kOutOfMemory,
        "sequence state for a context of {} tokens needs {:.1f} MiB but only {:.1f} MiB are available "
        "on {}; lower --ctx-size",
        o.ctx_size, static_cast<double>(need) / (1 << 20), static_cast<double>(have) / (1 << 20),
        backend.name());
  }
  SequenceState s;
  s.backend_ = &backend;
  s.spec_ = spec;
  s.options_ = o;
  auto make_layer = [&](LayerType t) -> Expected<LayerState> {
    LayerState l;
    if (t == LayerType::kFullAttention) {
      PD_ASSIGN_OR_RETURN(l.k, backend.alloc(o.kv_dtype, o.ctx_size, spec.kv_width));
      PD_ASSIGN_OR_RETURN(l.v, backend.alloc(o.kv_dtype, o.ctx_size, spec.kv_width));
    } else {
      PD_ASSIGN_OR_RETURN(l.conv, backend.alloc(DType::kF32, spec.conv_kernel - 1, spec.conv_channels));
      PD_ASSIGN_OR_RETURN(l.recurrent, backend.alloc(DType::kF32, spec.recurrent_heads,
                                                     spec.recurrent_size / spec.recurrent_heads));
      PD_ASSIGN_OR_RETURN(l.conv_snapshots, backend.alloc(DType::kF32, o.max_rows, conv_floats(spec)));
      PD_ASSIGN_OR_RETURN(l.recurrent_snapshots, backend.alloc(DType::kF32, o.max_rows, spec.recurrent_size));
    }
    return l;
  };
  for (LayerType t : spec.layers) {
    PD_ASSIGN_OR_RETURN(LayerState l, make_layer(t));
    s.layers_.push_back(std::move(l));
  }
  for (int i = 0; i < spec.mtp_layers; ++i) {
    PD_ASSIGN_OR_RETURN(LayerState l, make_layer(LayerType::kFullAttention));
    s.mtp_layers_.push_back(std::move(l));
  }
  return s;
}

int64_t SequenceState::nbytes() const {
  return plan_bytes(spec_, options_);
}

KvCache SequenceState::kv(int layer) const {
  const LayerState& l = layers_[static_cast<size_t>(layer)];
  return {.k = l.k.tensor(), .v = l.v.tensor()};
}

GdnState SequenceState::gdn(int layer) const {
  const LayerState& l = layers_[static_cast<size_t>(layer)];
  return {.conv = l.conv.tensor(), .recurrent = l.recurrent.tensor()};
}

GdnSnapshots SequenceState::snapshots(int layer) const {
  const LayerState& l = layers_[static_cast<size_t>(layer)];
  return {.conv = l.conv_snapshots.tensor(), .recurrent = l.recurrent_snapshots.tensor()};
}

KvCache SequenceState::mtp_kv(int mtp_layer) const {
  const LayerState& l = mtp_layers_[static_cast<size_t>(mtp_layer)];
  return {.k = l.k.tensor(), .v = l.v.tensor()};
}

void SequenceState::commit_step(int rows, bool snapshots_taken) {
  step_begin_ = length_;
  step_rows_ = rows;
  step_snapshots_ = snapshots_taken;
  length_ += rows;
}

Status SequenceState::rewind(int new_length) {
  if (new_length == length_) return Status::ok();
  const bool has_gdn = std::any_of(spec_.layers.begin(), spec_.layers.end(),
                                   [](LayerType t) { return t == LayerType::kLinearAttention; });
  if (new_length < 0 || new_length > length_) {
    return make_error(ErrorCode::kInvalidArgument, "rewind to {} tokens: the sequence has {}", new_length,
                      length_);
  }
  if (has_gdn) {
    const int row = new_length - step_begin_ - 1;
    if (!step_snapshots_ || row < 0 || row >= step_rows_) {
      return make_error(
          ErrorCode::kInvalidArgument,
          "rewind to {} tokens: GDN states are kept only for the rows of the last multi-row step "
          "(lengths {}..{}{})",
          new_length, step_begin_ + 1, step_begin_ + step_rows_,
          step_snapshots_ ? "" : "; that step kept no snapshots");
    }
    // One copy_many for every layer: a rollback is one kernel of the next step on the GPU.
    std::vector<CopyRegion> regions;
    for (size_t i = 0; i < layers_.size(); ++i) {
      if (spec_.layers[i] != LayerType::kLinearAttention) continue;
      const LayerState& l = layers_[i];
      for (const auto& [state, snapshots] :
           {std::pair(&l.conv, &l.conv_snapshots), std::pair(&l.recurrent, &l.recurrent_snapshots)}) {
        const Tensor from = snapshots->tensor().row_slice(row, 1);
        regions.push_back(
            {.dst = state->tensor(), .dst_offset = 0, .src = from, .src_offset = 0, .bytes = from.nbytes()});
      }
    }
    PD_TRY(backend_->copy_many(regions));
  }
  length_ = new_length;
  mtp_length_ = std::min(mtp_length_, new_length);
  return Status::ok();
}

void SequenceState::truncate_mtp(int n) {
  mtp_length_ = std::clamp(n, 0, mtp_length_);
}

Status SequenceState::reset() {
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (spec_.layers[i] != LayerType::kLinearAttention) continue;
    PD_TRY(backend_->fill_zero(layers_[i].conv.tensor()));
    PD_TRY(backend_->fill_zero(layers_[i].recurrent.tensor()));
  }
  length_ = 0;
  mtp_length_ = 0;
  step_begin_ = 0;
  step_rows_ = 0;
  step_snapshots_ = false;
  return Status::ok();
}

Status SequenceState::resume_at(int length, int mtp_length) {
  if (length < 0 || length > capacity() || mtp_length < 0 || mtp_length > length) {
    return make_error(ErrorCode::kInvalidArgument,
                      "resume at {} tokens ({} MTP rows): the context holds {} and the MTP rows at most {}",
                      length, mtp_length, capacity(), length);
  }
  length_ = length;
  mtp_length_ = spec_.mtp_layers > 0 ? mtp_length : 0;
  step_begin_ = length;
  step_rows_ = 0;
  step_snapshots_ = false;
  return Status::ok();
}

}  // namespace pd
