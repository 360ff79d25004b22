// A sequence state filled with random values instead of a prefill: `bench --fill synthetic` uses it for the
// long-context decode cells of random-weight models, where a real prefill of 128K or 256K tokens would not
// fit a device slot (docs/DESIGN.md §7 allows it there, labelled `fill: synthetic`). The values mean nothing;
// a decode step after the fill reads the same bytes as after a real prefill of `length` tokens.
#pragma once

#include <cstdint>

#include "puredrive/backend/backend.h"
#include "puredrive/model/sequence_state.h"

namespace pd {

// Amplitudes of the uniform values: keys and values like post-norm entries, conv windows like projections,
// recurrent states small enough to stay finite through a few hundred decode steps.
constexpr float kSyntheticKvAmplitude = 1.0f;
constexpr float kSyntheticConvAmplitude = 1.0f;
constexpr float kSyntheticRecurrentAmplitude = 0.05f;

// The uniform value in [-amplitude, amplitude) at `index` of the stream `seed` (counter-based: any index can
// be generated independently, so the fill is the same whatever the threads).
float synthetic_value(uint64_t seed, uint64_t index, float amplitude);

// For an empty `state` (length 0): keys and values at positions [0, length) of every main full-attention
// layer, every GDN conv window and recurrent state, then the state's length becomes `length` (a one-step
// history without GDN snapshots: it cannot be rewound). MTP caches stay empty. Layer l draws from the stream
// mixed from (seed, l, what); threads: 0 = hardware concurrency.
Status fill_synthetic(Backend& backend, SequenceState& state, int length, uint64_t seed, int threads = 0);

// The MTP head's caches the same way: keys and values at positions [0, length) of every MTP layer, then the
// state's MTP length becomes `length`. For `bench --mtp-draft`, whose cycles need a head cache as long as
// the context (its values, like all of a random-weight model's, mean nothing).
Status fill_synthetic_mtp(Backend& backend, SequenceState& state, int length, uint64_t seed, int threads = 0);

}  // namespace pd
