#include "puredrive/model/synthetic_fill.h"

#include <algorithm>
#include <vector>

#include "puredrive/util/dtype.h"
#include "puredrive/util/thread_pool.h"

namespace pd {
namespace {

uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t stream(uint64_t seed, int layer, int what) {
  return mix64(seed ^ mix64((static_cast<uint64_t>(layer) << 8) | static_cast<uint64_t>(what)));
}

// Rows [0, rows) of t from `seed`, element (r, c) being value r * cols + c, uploaded in chunks of about 64
// MiB.
Status fill_rows(Backend& be, ThreadPool& pool, const Tensor& t, int64_t rows, uint64_t seed,
                 float amplitude) {
  const int64_t cols = t.cols;
  const int64_t chunk = std::max<int64_t>(1, (int64_t{64} << 20) / std::max<int64_t>(1, cols * 4));
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    const size_t count = static_cast<size_t>(n * cols);
    if (t.dtype == DType::kBF16) {
      bf16.resize(count);
    } else {
      f32.resize(count);
    }
    pool.parallel_for(count, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) {
        const float v = synthetic_value(seed, static_cast<uint64_t>(r0 * cols) + i, amplitude);
        if (t.dtype == DType::kBF16) {
          bf16[i] = f32_to_bf16(v);
        } else {
          f32[i] = v;
        }
      }
    });
    const void* src = t.dtype == DType::kBF16 ? static_cast<const void*>(bf16.data()) : f32.data();
    PD_TRY(be.upload(t.row_slice(r0, n), src));
  }
  return Status::ok();
}

}  // namespace

float synthetic_value(uint64_t seed, uint64_t index, float amplitude) {
  const int32_t bits = static_cast<int32_t>(mix64(seed ^ mix64(index)) >> 32);
  return amplitude * (static_cast<float>(bits) * 4.656612873077393e-10f);  // 2^-31, exact
}

Status fill_synthetic(Backend& backend, SequenceState& state, int length, uint64_t seed, int threads) {
  if (state.length() != 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "synthetic fill: the sequence already holds {} tokens; it needs an empty one",
                      state.length());
  }
  if (length <= 0 || length > state.capacity()) {
    return make_error(ErrorCode::kInvalidArgument, "synthetic fill: {} tokens do not fit a context of {}",
                      length, state.capacity());
  }
  if (state.kv_dtype() != DType::kBF16 && state.kv_dtype() != DType::kF32) {
    return make_error(ErrorCode::kInvalidArgument, "synthetic fill: KV cache dtype {}",
                      dtype_name(state.kv_dtype()));
  }
  ThreadPool pool(threads);
  const CacheSpec& spec = state.spec();
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    const int li = static_cast<int>(l);
    if (spec.layers[l] == LayerType::kFullAttention) {
      const KvCache kv = state.kv(li);
      PD_TRY(fill_rows(backend, pool, kv.k, length, stream(seed, li, 0), kSyntheticKvAmplitude));
      PD_TRY(fill_rows(backend, pool, kv.v, length, stream(seed, li, 1), kSyntheticKvAmplitude));
    } else {
      const GdnState g = state.gdn(li);
      PD_TRY(fill_rows(backend, pool, g.conv, g.conv.rows, stream(seed, li, 2), kSyntheticConvAmplitude));
      PD_TRY(fill_rows(backend, pool, g.recurrent, g.recurrent.rows, stream(seed, li, 3),
                       kSyntheticRecurrentAmplitude));
    }
  }
  PD_TRY(backend.synchronize());
  state.commit_step(length, false);
  return Status::ok();
}

Status fill_synthetic_mtp(Backend& backend, SequenceState& state, int length, uint64_t seed, int threads) {
  if (length < 0 || length > state.capacity()) {
    return make_error(ErrorCode::kInvalidArgument, "synthetic MTP fill: {} tokens do not fit a context of {}",
                      length, state.capacity());
  }
  ThreadPool pool(threads);
  // Streams after the main layers' (layer numbers from 4096 on).
  for (int i = 0; i < state.spec().mtp_layers; ++i) {
    const KvCache kv = state.mtp_kv(i);
    PD_TRY(fill_rows(backend, pool, kv.k, length, stream(seed, 4096 + i, 0), kSyntheticKvAmplitude));
    PD_TRY(fill_rows(backend, pool, kv.v, length, stream(seed, 4096 + i, 1), kSyntheticKvAmplitude));
  }
  PD_TRY(backend.synchronize());
  state.commit_mtp(0, length);
  return Status::ok();
}

}  // namespace pd
