// The tile geometry, shared-memory layout and weight staging helpers of the prefill tensor-core products
// (gemm_mma.cu, which describes the kernel and its determinism).
#pragma once

#include "puredrive/backend/cuda/common.cuh"

namespace pd::cuda::gemm_tiles {

constexpr int kBM = kMmaRows;
constexpr int kBK = 32;
constexpr int kStages = 3;
constexpr int kThreads = 256;
constexpr int kXPitch = kBK + 8;  // floats per staged activation row
constexpr int kWPitch = kBK + 8;  // bf16 per staged weight row: 80 bytes, conflict-free ldmatrix

static_assert(kBM == 64, "the warp layout assumes 64-row tiles");

constexpr int kXStage = kBM * kXPitch;  // floats
constexpr int kAPitch = kBK + 8;        // bf16 per split activation row: conflict-free ldmatrix
constexpr int kAStage = kBM * kAPitch;  // bf16
constexpr int w_stage(bool wide) {      // bf16
  return (wide ? kMmaColsWide : kMmaCols) * kWPitch;
}

constexpr int kAffineStages = 4;  // affine: stages in flight (codes become bf16 one stage ahead)
// Affine: a stage's codes, kBK * BITS / 8 bytes per weight row, and each row's scale and bias as the aligned
// words that hold them.
constexpr int code_stage(int bits) {  // bytes
  return kMmaCols * kBK * bits / 8;
}
constexpr int kScaleStage = kMmaCols * 2;  // words
// The copy size for a stage's codes: a row's kBK codes are 4 BITS bytes and start on a multiple of that, so
// the largest of 16, 8 and 4 that divides it.
constexpr int code_copy_bytes(int bits) {
  return (4 * bits) % 16 == 0 ? 16 : (4 * bits) % 8 == 0 ? 8 : 4;
}

template <int FMT, int BITS, bool WIDE>
constexpr size_t smem_bytes() {
  if constexpr (FMT == static_cast<int>(WFmt::kAffine)) {
    return static_cast<size_t>(kAffineStages) * (kXStage * 4 + code_stage(BITS) + kScaleStage * 4) +
           size_t{2} * w_stage(false) * 2 + size_t{2} * 2 * kAStage * 2;
  } else {
    const bool split = FMT != static_cast<int>(WFmt::kBF16);
    return static_cast<size_t>(kStages) * (kXStage * 4 + w_stage(WIDE) * 2 * (split ? 2 : 1)) +
           size_t{2} * 2 * kAStage * 2;
  }
}

// Eight affine codes centred to q - 2^(BITS-1) as bf16 (exact: at most 8 significant bits): 2^23 + q is
// the f32 with q in its low mantissa bits, and subtracting 2^23 + o leaves q - o exactly.
// 8-bit codes are whole bytes: one byte permute builds each f32.
template <int BITS>
__device__ __forceinline__ uint4 centred_codes(uint64_t v) {
  constexpr uint64_t kMask = (1ull << BITS) - 1ull;
  constexpr float kBase = 8388608.0f + static_cast<float>(1 << (BITS - 1));
  const auto as_f32 = [&](int i) {
    if constexpr (BITS == 8) {
      // Bytes (code i, 0, 0, 0x4B) of (v's word, 0x4B000000).
      const uint32_t word = static_cast<uint32_t>(v >> (32 * (i / 4)));
      return __uint_as_float(__byte_perm(word, 0x4B000000u, 0x7440u | static_cast<uint32_t>(i % 4)));
    } else {
      return __uint_as_float(0x4B000000u | static_cast<uint32_t>((v >> (BITS * i)) & kMask));
    }
  };
  uint32_t out[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(as_f32(2 * j) - kBase, as_f32(2 * j + 1) - kBase);
    out[j] = *reinterpret_cast<const uint32_t*>(&h);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// A scale or bias from the aligned word that held it: f32, or the upper (`upper`) or lower 16-bit half.
__device__ __forceinline__ float scale_from_word(SDType t, uint32_t word, bool upper) {
  if (t == SDType::kF32) return __uint_as_float(word);
  const uint32_t h = upper ? word >> 16 : word & 0xffffu;
  return t == SDType::kBF16 ? bf16_bits(h) : f16_bits(h);
}

struct WSource {
  const DevMatrix* m;
  const void* data;
  const void* scales;
  const void* biases;
  int64_t n;  // weight row
  bool ok;    // inside the matrix
};

__device__ __forceinline__ WSource weight_source(const DevMatrix& m, int64_t expert, int64_t n) {
  WSource s;
  s.m = &m;
  s.data = static_cast<const uint8_t*>(m.data) + expert * m.data_stride;
  s.scales = m.scales == nullptr ? nullptr : static_cast<const uint8_t*>(m.scales) + expert * m.scale_stride;
  s.biases = m.biases == nullptr ? nullptr : static_cast<const uint8_t*>(m.biases) + expert * m.scale_stride;
  s.n = n;
  s.ok = n < m.rows;
  return s;
}

// Each thread stages kChunks chunks of 8 columns of the weight tile (row c / 4, columns 8 (c % 4) of the
// stage) and kXChunks chunks of 4 activations (row c / 8, columns 4 (c % 8)).
constexpr int kXChunks = kBM * kBK / 4 / kThreads;
static_assert(kXChunks == 2, "activation staging assumes two chunks per thread");

}  // namespace pd::cuda::gemm_tiles
