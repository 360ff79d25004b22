// Affine 8-bit weights on the weight stream (stream_ring.cuh), shared by gemv_stream.cu and moe_stream.cu.
//
// Per group of columns the product is y = s * sum((q - 128) x) + (b + 128 s) * sum(x). The centred codes
// are exact in bf16, so they enter the mma as the A operand (the activations hi + lo, as for bf16 weights),
// and the two terms do not cancel the way s * sum(q x) and b * sum(x) would. Each group's sum(x) is taken
// once per activation row, in f32. Lane (g, q) holds, for mma step j of its warp's slice, columns
// 16 j + 4 q .. + 3 of weight rows g and g + 8 (a 32-bit word of codes each) and of activation row g, so a
// step stays inside a group (32, 64 or 128 columns).
//
// A stage is one tile of whole rows: 16 rows of codes (rows 16 bytes apart modulo 128, so that the warp's
// 32-bit code loads, rows g and columns 4 q, hit 32 banks), then the 16 rows' scales and their biases as
// blocks of 8 rows each (one bulk copy each: the checkpoint stores consecutive rows' scales contiguously).
// Three copies of a few hundred bytes per row instead of one of kilobytes ran the 8-bit decode slower than
// the CUDA-core kernels (H200).
#pragma once

#include "puredrive/backend/cuda/stream_ring.cuh"

namespace pd::cuda::stream {

template <int KB>
struct AffineShape {
  static constexpr int kCols = 512 * KB;
  static constexpr int kSlice = kCols / kConsumers;  // columns per consumer warp: 32 - 256
  static constexpr int kSteps = kSlice / 16;         // mma steps per warp and tile
  static constexpr int kRowBytes = kCols + 16;
  static constexpr int kMetaBytes = kTile * (kCols / 32) * 2;  // room for 2-byte scales of groups >= 32
  static constexpr int kScales = kTile * kRowBytes;            // stage offsets of the scales and biases
  static constexpr int kBiases = kScales + kMetaBytes;
  static constexpr int kStageBytes = kBiases + kMetaBytes;
  static constexpr int kStages = 200 * 1024 / kStageBytes < 12 ? 200 * 1024 / kStageBytes : 12;
  static constexpr int kSmemBytes = kStages * kStageBytes + 2 * kConsumers * 32 * 16 + 2 * kStages * 8;
};

// Bytes of one row's scales (or biases).
__host__ __device__ inline int meta_row_bytes(const DevMatrix& m) {
  return static_cast<int>(m.cols / m.group_size) * (m.scale_dtype == SDType::kF32 ? 4 : 2);
}

// Whether m's scales fit AffineShape's room and copy in 16-byte pieces (any number of rows).
inline bool affine_stream_layout(const DevMatrix& m) {
  const int mrb = meta_row_bytes(m);
  return m.fmt == WFmt::kAffine && m.bits == 8 &&
         (m.group_size == 32 || m.group_size == 64 || m.group_size == 128) && mrb % 16 == 0 &&
         static_cast<int64_t>(mrb) * 16 <= m.cols && reinterpret_cast<uintptr_t>(m.scales) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(m.biases) % 16 == 0;
}

__device__ __forceinline__ float meta_at(const uint8_t* p, SDType t) {
  if (t == SDType::kF32) return *reinterpret_cast<const float*>(p);
  const uint16_t h = *reinterpret_cast<const uint16_t*>(p);
  return t == SDType::kBF16 ? bf16_bits(h) : f16_bits(h);
}

// Codes (bytes) I and I + 1 of w as a bf16 pair of q - 128, exactly: each byte becomes the low mantissa
// byte of the f32 2^23 + q, minus 2^23 + 128; a small integer's f32 has a zero low half, so its top half is
// its bf16.
template <int I>
__device__ __forceinline__ uint32_t centred_pair(uint32_t w) {
  constexpr uint32_t kMagic = 0x4B000000u;
  const float a = __uint_as_float(__byte_perm(w, kMagic, 0x7440 + I)) - 8388736.0f;
  const float b = __uint_as_float(__byte_perm(w, kMagic, 0x7441 + I)) - 8388736.0f;
  return __byte_perm(__float_as_uint(a), __float_as_uint(b), 0x7632);
}

// The group layout of a launch's matrices: group size, scale dtype, bytes of a row's scales.
struct AffineMeta {
  int group = 64;
  SDType dtype = SDType::kBF16;
  int row_bytes = 0;
  __device__ explicit AffineMeta(const DevMatrix& m)
      : group(m.group_size), dtype(m.scale_dtype), row_bytes(meta_row_bytes(m)) {}
};

// Lane (g, q)'s activations of one row for a warp's slice, PPS group pieces per slice (slice / min(group
// size, slice)): B fragments (hi pair, lo pair per mma step: columns 4 q, 4 q + 1 and 4 q + 2, 4 q + 3 of
// each 16) and each piece's sum of the row, for rows 2 q and 2 q + 1 (the lane's outputs).
template <typename S, int PPS>
struct AffineX {
  static constexpr int kPieceSteps = S::kSteps / PPS;
  uint32_t frag[S::kSteps][4];
  float xsum[PPS][2];

  // The lane's raw values of row g (p: the row at the warp's slice; zeros when null).
  template <bool VEC>
  __device__ static void load_raw(const float* p, int q, float (&v)[S::kSteps][4]) {
#pragma unroll
    for (int j = 0; j < S::kSteps; ++j) {
      if (p == nullptr) {
        v[j][0] = v[j][1] = v[j][2] = v[j][3] = 0.0f;
      } else if constexpr (VEC) {
        const float4 a = *reinterpret_cast<const float4*>(p + 16 * j + 4 * q);
        v[j][0] = a.x, v[j][1] = a.y, v[j][2] = a.z, v[j][3] = a.w;
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) v[j][e] = p[16 * j + 4 * q + e];
      }
    }
  }
  // Fragments and sums from the raw values (the whole warp: the sums are shuffled).
  __device__ void make(const float (&v)[S::kSteps][4], int q) {
    float part[S::kSteps];
#pragma unroll
    for (int j = 0; j < S::kSteps; ++j) {
      split_pair(v[j][0], v[j][1], &frag[j][0], &frag[j][2]);
      split_pair(v[j][2], v[j][3], &frag[j][1], &frag[j][3]);
      part[j] = (v[j][0] + v[j][1]) + (v[j][2] + v[j][3]);
    }
#pragma unroll
    for (int p = 0; p < PPS; ++p) {
      float sum = part[p * kPieceSteps];
#pragma unroll
      for (int j = 1; j < kPieceSteps; ++j) sum += part[p * kPieceSteps + j];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);  // the row's four lanes: the same bits in each
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      xsum[p][0] = __shfl_sync(0xffffffffu, sum, 8 * q);
      xsum[p][1] = __shfl_sync(0xffffffffu, sum, 8 * q + 4);
    }
  }
};

// acc += the staged tile x this warp's slice of the activations: per group piece, the mma of the centred
// codes, then scale and bias of rows g and g + 8.
template <typename S, int PPS>
__device__ __forceinline__ void affine_product(const uint8_t* st, int warp, int lane, const AffineMeta& meta,
                                               const AffineX<S, PPS>& x, float acc[4]) {
  constexpr int kPieceSteps = AffineX<S, PPS>::kPieceSteps;
  const int g = lane >> 2, q = lane & 3;
  const int col = warp * S::kSlice + 4 * q;  // byte offset of the lane's codes in a staged row
  const uint8_t* rg = st + g * S::kRowBytes;
  const uint8_t* r8 = st + (g + 8) * S::kRowBytes;
  const int sb = meta.dtype == SDType::kF32 ? 4 : 2;
  float ga[4] = {};
#pragma unroll
  for (int j = 0; j < S::kSteps; ++j) {
    const uint32_t wg = *reinterpret_cast<const uint32_t*>(rg + col + 16 * j);
    const uint32_t w8 = *reinterpret_cast<const uint32_t*>(r8 + col + 16 * j);
    const uint32_t a[4] = {centred_pair<0>(wg), centred_pair<0>(w8), centred_pair<2>(wg),
                           centred_pair<2>(w8)};
    mma_bf16(ga, a, x.frag[j][0], x.frag[j][1]);
    mma_bf16(ga, a, x.frag[j][2], x.frag[j][3]);
    if ((j + 1) % kPieceSteps == 0) {
      const int p = j / kPieceSteps;
      const int gi = (warp * S::kSlice + p * kPieceSteps * 16) / meta.group;
      const uint8_t* sg = st + S::kScales + g * meta.row_bytes + gi * sb;
      const uint8_t* s8 = sg + 8 * meta.row_bytes;
      const float scale_g = meta_at(sg, meta.dtype), scale_8 = meta_at(s8, meta.dtype);
      const float bias_g = meta_at(sg + S::kMetaBytes, meta.dtype) + 128.0f * scale_g;
      const float bias_8 = meta_at(s8 + S::kMetaBytes, meta.dtype) + 128.0f * scale_8;
      acc[0] = acc[0] + (scale_g * ga[0] + bias_g * x.xsum[p][0]);
      acc[1] = acc[1] + (scale_g * ga[1] + bias_g * x.xsum[p][1]);
      acc[2] = acc[2] + (scale_8 * ga[2] + bias_8 * x.xsum[p][0]);
      acc[3] = acc[3] + (scale_8 * ga[3] + bias_8 * x.xsum[p][1]);
#pragma unroll
      for (int e = 0; e < 4; ++e) ga[e] = 0.0f;
    }
  }
}

// Producer lanes 16-19: the scales and biases of rows [n0, n0 + count) of matrix m (data pointers already
// offset to the expert) to block rows [r0, r0 + count) of fill f's stage; returns the bytes (lane-uniform).
template <typename S>
__device__ __forceinline__ uint32_t copy_meta(const Ring<S>& ring, int f, int lane, int first_lane,
                                              const void* scales, const void* biases, int row_bytes,
                                              int64_t n0, int r0, int count) {
  const uint32_t bytes = static_cast<uint32_t>(count * row_bytes);
  if (lane == first_lane) {
    ring.copy(f, S::kScales + r0 * row_bytes, static_cast<const uint8_t*>(scales) + n0 * row_bytes, bytes);
  } else if (lane == first_lane + 1) {
    ring.copy(f, S::kBiases + r0 * row_bytes, static_cast<const uint8_t*>(biases) + n0 * row_bytes, bytes);
  }
  return 2 * bytes;
}

// The launch of an affine stream kernel for `pps` group pieces per warp slice: launch(kernel<PPS>) for PPS
// = 1, 2, 4, ... up to groups of 32 columns. F: a callable taking std::integral_constant<int, PPS>.
template <typename S, int PPS = 1, typename F>
void with_pieces(int group_size, F&& f) {
  const int pps = S::kSlice / (group_size < S::kSlice ? group_size : S::kSlice);
  if constexpr (PPS * 32 < S::kSlice) {
    if (pps != PPS) {
      with_pieces<S, 2 * PPS>(group_size, f);
      return;
    }
  }
  f(std::integral_constant<int, PPS>{});
}

}  // namespace pd::cuda::stream
