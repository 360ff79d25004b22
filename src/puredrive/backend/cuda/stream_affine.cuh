// Affine 4-, 6- and 8-bit weights on the weight stream (stream_ring.cuh), shared by gemv_stream.cu and
// the MoE stream kernels (moe_stream_tiles.cuh).
//
// The codes enter the tensor cores as their values: mma m16n8k32 with the codes as the unsigned 8-bit A
// operand (8-bit codes as stored, 4- and 6-bit codes spread to one byte each as they are read from the
// stage) and the activations as B in 8-bit pieces of a 24-bit fixed-point form. Per warp slice and
// activation row, x_int = round(x * 2^sh) with sh fixed by the largest |x| of that slice and row (22 bits
// below it), split x_int = p2 * 2^16 + p1 * 2^8 + p0 (p0, p1 unsigned, p2 signed); three integer products
// per 32 columns give sum(q * x_int) exactly. Per group piece, sum((q - o) x_int) is formed exactly in
// 64 bits, converted to f32 once and scaled by 2^-sh (exact), and y = s * sum((q - o) x) +
// (b + o s) * sum(x) with o = 2^(bits - 1): centred, the two terms do not cancel. The bf16 form of the same
// product (codes converted to bf16 in registers, activations hi + lo) made the conversion the dense kernel's
// busiest pipe (ALU 33%, ncu on the H200); the integer form has none: the 8-bit dense products 14.6 -> 13.8
// us on average. Integer sums are also exact, so their order cannot change a result.
//
// Lane (g, q) holds, for k block j of 32 columns of its warp's slice, columns 32 j + 8 q .. + 7 of weight
// rows g and g + 8 (8 codes each, stored in `bits` bytes: the mma's k slots 4 q .. 4 q + 3 and
// 16 + 4 q .. + 3) and of activation row g. A group (32, 64 or 128 columns) is whole k blocks or whole
// slices.
//
// A stage is one tile of whole rows: 16 rows of codes (8-bit rows 32 bytes apart modulo 128, so that each
// half warp's 8-byte code loads, rows g and columns 8 q, hit 32 banks; 4-bit rows 16 apart for 4-byte loads;
// 6-bit rows 32 apart, where rows g and g + 4 share banks), then the 16 rows' scales and their biases
// as blocks of 8 rows each (one bulk copy each: the checkpoint stores consecutive rows' scales
// contiguously). Three copies of a few hundred bytes per row instead of one of kilobytes ran the 8-bit
// decode slower than the CUDA-core kernels (H200).
#pragma once

#include "puredrive/backend/cuda/stream_ring.cuh"

namespace pd::cuda::stream {

// Tiles the consumer warps multiply between two exchanges of their partials: an affine tile is 16-32 KB,
// where a bf16 one is 64 KB, and each exchange is a barrier of all consumer warps and a sum by 128 threads.
constexpr int kTilesPerSync = 2;

template <int KB, int BITS>
struct AffineShape {
  static constexpr int kBits = BITS;
  static constexpr int kCols = 512 * KB;
  static constexpr int kSlice = kCols / kConsumers;    // columns per consumer warp: 32 - 256
  static constexpr int kBlocks = kSlice / 32;          // k blocks (mma steps) per warp and tile
  static constexpr int kCodeBytes = kCols * BITS / 8;  // a row's codes: a multiple of 16 bytes
  static constexpr int kRowBytes = kCodeBytes + (BITS == 4 ? 16 : 32);
  static constexpr int kMetaBytes = kTile * (kCols / 32) * 2;  // room for 2-byte scales of groups >= 32
  static constexpr int kScales = kTile * kRowBytes;            // stage offsets of the scales and biases
  static constexpr int kBiases = kScales + kMetaBytes;
  static constexpr int kStageBytes = kBiases + kMetaBytes;
  // The warps' partials: two buffers of a pair of tiles (kTilesPerSync), paid for by the ring.
  static constexpr int kPartSlots = 2 * kTilesPerSync;
  static constexpr int kRing = 200 * 1024 - (kPartSlots - 2) * kConsumers * 32 * 16;
  static constexpr int kStages = kRing / kStageBytes < 12 ? kRing / kStageBytes : 12;
  static constexpr int kSmemBytes =
      kStages * kStageBytes + kPartSlots * kConsumers * 32 * 16 + 2 * kStages * 8;
};

// Bytes of one row's scales (or biases).
__host__ __device__ inline int meta_row_bytes(const DevMatrix& m) {
  return static_cast<int>(m.cols / m.group_size) * (m.scale_dtype == SDType::kF32 ? 4 : 2);
}

// Whether m's codes have a streamed width (4, 6 or 8 bits), its scales are 2-byte values (bf16 or f16: the
// consumers read them without a branch on the dtype; f32 scales take the CUDA-core kernels) that fit
// AffineShape's room and copy in 16-byte pieces (any number of rows).
inline bool affine_stream_layout(const DevMatrix& m) {
  const int mrb = meta_row_bytes(m);
  return m.fmt == WFmt::kAffine && (m.bits == 4 || m.bits == 6 || m.bits == 8) &&
         m.scale_dtype != SDType::kF32 && (m.group_size == 32 || m.group_size == 64 || m.group_size == 128) &&
         mrb % 16 == 0 && static_cast<int64_t>(mrb) * 16 <= m.cols &&
         reinterpret_cast<uintptr_t>(m.scales) % 16 == 0 && reinterpret_cast<uintptr_t>(m.biases) % 16 == 0;
}

// The group layout of a launch's matrices (affine_stream_layout): log2 of the group size, f16 or bf16 scales,
// bytes of a row's scales.
struct AffineMeta {
  int group_shift = 6;
  bool f16 = false;
  int row_bytes = 0;
  __device__ explicit AffineMeta(const DevMatrix& m)
      : group_shift(m.group_size == 32   ? 5
                    : m.group_size == 64 ? 6
                                         : 7),
        f16(m.scale_dtype == SDType::kF16),
        row_bytes(meta_row_bytes(m)) {}
};

// N consecutive 2-byte scales (or biases) of a staged row, a warp slice's groups, in one shared-memory load:
// the group index and the dtype were a division and two branches per value, over a quarter of an 8-bit
// product's instructions (SASS of gemv_stream_affine_kernel).
template <int N>
struct MetaRun {
  uint32_t w[(N + 1) / 2];
  __device__ explicit MetaRun(const uint8_t* p) {
    if constexpr (N == 1) {
      w[0] = *reinterpret_cast<const uint16_t*>(p);
    } else if constexpr (N == 2) {
      w[0] = *reinterpret_cast<const uint32_t*>(p);
    } else if constexpr (N == 4) {
      const uint2 v = *reinterpret_cast<const uint2*>(p);
      w[0] = v.x, w[1] = v.y;
    } else {
      static_assert(N == 8, "1, 2, 4 or 8 groups per warp slice");
      const uint4 v = *reinterpret_cast<const uint4*>(p);
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    }
  }
  __device__ float at(int i, bool f16) const {
    const uint32_t h = (w[i / 2] >> (16 * (i & 1))) & 0xffffu;
    return f16 ? f16_bits(h) : bf16_bits(h);
  }
};

// 2^e for -126 <= e <= 127, exactly.
__device__ __forceinline__ float pow2f(int e) {
  return __int_as_float((127 + e) << 23);
}

template <bool UB>  // B unsigned (pieces p0, p1) or signed (p2)
__device__ __forceinline__ void imma(int d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  if constexpr (UB) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Lane (g, q)'s activations of one row for a warp's slice, PPS group pieces per slice (slice / min(group
// size, slice)): the B fragments of the three pieces per k block, and for the lane's outputs (rows 2 q and
// 2 q + 1) each piece's sum(x_int) and the rows' 2^-sh.
template <typename S, int PPS>
struct AffineX {
  static constexpr int kPieceBlocks = S::kBlocks / PPS;
  uint32_t frag[S::kBlocks][3][2];
  int xsum[PPS][2];
  float unscale[2];

  // The lane's raw values of row g (p: the row at the warp's slice; zeros when null). A fused input norm
  // scales them after (gemv_stream.cu), so that these loads fly with the norm's.
  template <bool VEC>
  __device__ static void load_raw(const float* p, int q, float (&v)[S::kBlocks][8]) {
#pragma unroll
    for (int j = 0; j < S::kBlocks; ++j) {
      if (p == nullptr) {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[j][e] = 0.0f;
      } else {
        load_x8<VEC>(p + 32 * j + 8 * q, v[j]);
      }
    }
  }
  // Fixed-point pieces and sums from the raw values (the whole warp: the scale and sums are shuffled).
  __device__ void make(const float (&v)[S::kBlocks][8], int q) {
    float most = 0.0f;
#pragma unroll
    for (int j = 0; j < S::kBlocks; ++j) {
#pragma unroll
      for (int e = 0; e < 8; ++e) most = fmaxf(most, fabsf(v[j][e]));
    }
    most = fmaxf(most, __shfl_xor_sync(0xffffffffu, most, 1));  // the row's four lanes
    most = fmaxf(most, __shfl_xor_sync(0xffffffffu, most, 2));
    int e2 = 0;
    frexpf(most, &e2);                                              // most < 2^e2
    const int sh = most > 0.0f ? min(max(22 - e2, -100), 100) : 0;  // |x_int| < 2^22
    // 2^sh is a normal float, so v * 2^sh is ldexpf(v, sh) (exact below 2^22, rounded alike when tiny, where
    // the integer is 0 either way) in one multiply where ldexpf took three.
    const float up = pow2f(sh);
    int part[S::kBlocks];
#pragma unroll
    for (int j = 0; j < S::kBlocks; ++j) {
      part[j] = 0;
      uint32_t b[3][2] = {};
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int xi = __float2int_rn(v[j][e] * up);
        part[j] += xi;
        const int shift = 8 * (e & 3);
        b[0][e >> 2] |= static_cast<uint32_t>(xi & 0xff) << shift;
        b[1][e >> 2] |= static_cast<uint32_t>((xi >> 8) & 0xff) << shift;
        b[2][e >> 2] |= static_cast<uint32_t>((xi >> 16) & 0xff) << shift;
      }
#pragma unroll
      for (int k = 0; k < 3; ++k) frag[j][k][0] = b[k][0], frag[j][k][1] = b[k][1];
    }
#pragma unroll
    for (int p = 0; p < PPS; ++p) {
      int sum = 0;
#pragma unroll
      for (int j = 0; j < kPieceBlocks; ++j) sum += part[p * kPieceBlocks + j];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      xsum[p][0] = __shfl_sync(0xffffffffu, sum, 8 * q);
      xsum[p][1] = __shfl_sync(0xffffffffu, sum, 8 * q + 4);
    }
    unscale[0] = pow2f(-__shfl_sync(0xffffffffu, sh, 8 * q));
    unscale[1] = pow2f(-__shfl_sync(0xffffffffu, sh, 8 * q + 4));
  }
};

// Four 6-bit codes (the low 24 bits of v; the top byte is ignored) spread to one byte each: the two 12-bit
// halves to bits 0 and 16, then each half's upper code moved up 2 bits by adding 3 times itself. Five
// integer operations, two of them multiply-adds on the FMA pipe, where shifting and masking each code took
// seven on the integer pipe (the 6-bit output head ran at 2.14 TB/s against 8-bit's 3.06,
// bench/results/2026-12-04-h200-311d8db.md).
__device__ __forceinline__ uint32_t spread6(uint32_t v) {
  const uint32_t p = (v & 0xfffu) + (v & 0xfff000u) * 16u;
  return p + (p & 0x0fc00fc0u) * 3u;
}

// The eight codes of chunk c (columns 8 c .. 8 c + 7) of a staged row, one byte each: codes 0-3 and 4-7.
// The row's bit stream holds them LSB first from byte c * BITS (MLX's packing).
template <int BITS>
__device__ __forceinline__ uint2 staged_codes(const uint8_t* row, int c) {
  if constexpr (BITS == 8) {
    return *reinterpret_cast<const uint2*>(row + 8 * c);
  } else if constexpr (BITS == 4) {
    const uint32_t w = *reinterpret_cast<const uint32_t*>(row + 4 * c);
    const uint32_t even = w & 0x0f0f0f0fu, odd = (w >> 4) & 0x0f0f0f0fu;  // codes 0, 2, 4, 6 and 1, 3, 5, 7
    return make_uint2(__byte_perm(even, odd, 0x5140), __byte_perm(even, odd, 0x7362));
  } else {
    static_assert(BITS == 6, "4-, 6- and 8-bit codes");
    // 6 bytes from 6 c: two aligned words hold them (c odd: 2 bytes into the first); each 3-byte half is
    // picked out with one byte permutation.
    const uint32_t* w = reinterpret_cast<const uint32_t*>(row + 6 * c - 2 * (c & 1));
    const uint32_t odd = 0x222u * static_cast<uint32_t>(c & 1);
    return make_uint2(spread6(__byte_perm(w[0], w[1], 0x210u + odd)),
                      spread6(__byte_perm(w[0], w[1], 0x543u + odd)));
  }
}

// acc += the staged tile x this warp's slice of the activations: per group piece, the exact integer
// products, then scale and bias of rows g and g + 8.
// X: AffineX of S's width (of any code width).
template <typename S, int PPS, typename X>
__device__ __forceinline__ void affine_product(const uint8_t* st, int warp, int lane, const AffineMeta& meta,
                                               const X& x, float acc[4]) {
  constexpr int kPieceBlocks = X::kPieceBlocks;
  constexpr int kOffset = 1 << (S::kBits - 1);
  const int g = lane >> 2, q = lane & 3;
  const int chunk = (warp * S::kSlice) / 8 + q;  // the lane's first 8 codes in a staged row
  const uint8_t* rg = st + g * S::kRowBytes;
  const uint8_t* r8 = st + (g + 8) * S::kRowBytes;
  // The slice's groups: piece p is group first + p (PPS > 1: a piece is a group), or the slice lies in one.
  const uint8_t* mg = st + S::kScales + g * meta.row_bytes + 2 * ((warp * S::kSlice) >> meta.group_shift);
  const uint8_t* m8 = mg + 8 * meta.row_bytes;
  const MetaRun<PPS> sg(mg), s8(m8), bg(mg + S::kMetaBytes), b8(m8 + S::kMetaBytes);
  int d[3][4] = {};
#pragma unroll
  for (int j = 0; j < S::kBlocks; ++j) {
    const uint2 wg = staged_codes<S::kBits>(rg, chunk + 4 * j);
    const uint2 w8 = staged_codes<S::kBits>(r8, chunk + 4 * j);
    const uint32_t a[4] = {wg.x, w8.x, wg.y, w8.y};
    imma<true>(d[0], a, x.frag[j][0][0], x.frag[j][0][1]);
    imma<true>(d[1], a, x.frag[j][1][0], x.frag[j][1][1]);
    imma<false>(d[2], a, x.frag[j][2][0], x.frag[j][2][1]);
    if ((j + 1) % kPieceBlocks == 0) {
      const int p = j / kPieceBlocks;
      const float scale[2] = {sg.at(p, meta.f16), s8.at(p, meta.f16)};
      const float bias[2] = {bg.at(p, meta.f16) + kOffset * scale[0],
                             b8.at(p, meta.f16) + kOffset * scale[1]};
#pragma unroll
      for (int e = 0; e < 4; ++e) {  // weight row g + 8 (e >> 1), activation row 2 q + (e & 1)
        const int64_t sum = (static_cast<int64_t>(d[2][e]) << 16) + (static_cast<int64_t>(d[1][e]) << 8) +
                            d[0][e] - kOffset * static_cast<int64_t>(x.xsum[p][e & 1]);
        const float centred = static_cast<float>(sum) * x.unscale[e & 1];
        const float xs = static_cast<float>(x.xsum[p][e & 1]) * x.unscale[e & 1];
        acc[e] = acc[e] + (scale[e >> 1] * centred + bias[e >> 1] * xs);
        d[0][e] = d[1][e] = d[2][e] = 0;
      }
    }
  }
}

// Producer lanes 16-19: the scales and biases of rows [n0, n0 + count) of matrix m (data pointers already
// offset to the expert) to block rows [r0, r0 + count) of fill f's stage; returns the bytes (lane-uniform).
// T: the stage layout (an AffineShape), S: the ring's.
template <typename T, typename S>
__device__ __forceinline__ uint32_t copy_meta(const Ring<S>& ring, int f, int lane, int first_lane,
                                              const void* scales, const void* biases, int row_bytes,
                                              int64_t n0, int r0, int count) {
  const uint32_t bytes = static_cast<uint32_t>(count * row_bytes);
  if (lane == first_lane) {
    ring.copy(f, T::kScales + r0 * row_bytes, static_cast<const uint8_t*>(scales) + n0 * row_bytes, bytes);
  } else if (lane == first_lane + 1) {
    ring.copy(f, T::kBiases + r0 * row_bytes, static_cast<const uint8_t*>(biases) + n0 * row_bytes, bytes);
  }
  return 2 * bytes;
}

// Calls f(std::integral_constant<int, BITS>{}) for a streamed code width (affine_stream_layout).
template <typename F>
void with_stream_bits(int bits, F&& f) {
  with_one_of<4, 6, 8>(bits == 4 || bits == 6 ? bits : 8, f);
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
