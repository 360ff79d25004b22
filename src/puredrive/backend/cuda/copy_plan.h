// copy_many on the GPU (backend.h CopyRegion): every region becomes pieces of at most kCopyPieceBytes that
// one kernel launch copies, one thread block per piece, reading its piece table from mapped pinned host
// memory (no upload of the table, no device scratch). Regions with a side in pageable host memory (the prefix
// cache's host tier) go through that pinned memory too: their host bytes are copied into it before the launch
// (the kernel reads them over the bus) or out of it after the launch has run (the kernel writes them there).
// The pinned bytes a launch needs are bounded (kCopyRoundBytes), so a large host transfer takes a few rounds
// of one launch each; device-only lists, whatever their length, take one.
//
// Host code only, free of the CUDA headers and of C++20 (the kernel's .cu includes it), so that the plan is
// tested on machines without the toolkit (backend/copy_plan_test.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

struct CUstream_st;  // cudaStream_t, declared without the CUDA headers

namespace pd::cuda {

constexpr int64_t kCopyPieceBytes = int64_t{64} << 10;  // a thread block's share: long regions spread out
constexpr int64_t kCopyRoundBytes = int64_t{16} << 20;  // host bytes staged per launch
constexpr int64_t kCopyTableAlign = 256;

// One piece of a launch; addresses as the device sees them.
struct CopyPiece {
  const uint8_t* src;
  uint8_t* dst;
  int64_t bytes;
};

// Copies pieces[0, count) (count > 0), 16 bytes at a time where source and destination share their alignment.
void launch_copy_pieces(const CopyPiece* pieces, int64_t count, CUstream_st* stream);

// A step's copies, uploads and zero fills as kernels (rows of `width` bytes, pitches in bytes; src may be
// mapped pinned host memory): a graph launches memcpy and memset nodes far slower than kernel nodes.
void launch_copy_rows(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t width,
                      int64_t rows, CUstream_st* stream);
void launch_zero_rows(void* dst, int64_t pitch, int64_t width, int64_t rows, CUstream_st* stream);

// A validated region with both addresses resolved; a host side is pageable memory the kernel cannot reach.
struct CopySpan {
  uint8_t* dst = nullptr;
  const uint8_t* src = nullptr;
  int64_t bytes = 0;
  bool dst_host = false;
  bool src_host = false;
};

// Host bytes of a round staged at `offset` of its data area (see CopyRound): copied in before the launch, or
// out after it.
struct StagedIn {
  const uint8_t* host;
  int64_t offset;
  int64_t bytes;
};
struct StagedOut {
  uint8_t* host;
  int64_t offset;
  int64_t bytes;
};

// One launch: its pieces and the host bytes they stage. Pinned memory of a round: the piece table at 0, then
// the data area at data_offset(). A piece with a staged side holds its offset in the data area there until
// write_table() places it.
struct CopyRound {
  std::vector<CopyPiece> pieces;
  std::vector<uint8_t> staged;  // per piece: kStagedSrc | kStagedDst
  std::vector<StagedIn> in;
  std::vector<StagedOut> out;
  int64_t data_bytes = 0;

  static constexpr uint8_t kStagedSrc = 1, kStagedDst = 2;

  int64_t data_offset() const {
    const int64_t table = static_cast<int64_t>(pieces.size() * sizeof(CopyPiece));
    return (table + kCopyTableAlign - 1) / kCopyTableAlign * kCopyTableAlign;
  }
  int64_t pinned_bytes() const { return data_offset() + data_bytes; }

  // The piece table, with staged sides at device address `device` (of pinned memory aligned to
  // kCopyTableAlign), written to that memory's host address `host`.
  void write_table(uint8_t* host, uint8_t* device) const {
    uint8_t* data = device + data_offset();
    auto* table = reinterpret_cast<CopyPiece*>(host);
    for (size_t i = 0; i < pieces.size(); ++i) {
      CopyPiece p = pieces[i];
      if (staged[i] & kStagedSrc) p.src = data + reinterpret_cast<uintptr_t>(p.src);
      if (staged[i] & kStagedDst) p.dst = data + reinterpret_cast<uintptr_t>(p.dst);
      table[i] = p;
    }
  }
};

// Splits spans (none host to host) into rounds of at most round_bytes staged host bytes each, and every span
// into pieces of at most piece_bytes (a multiple of 16). A staged side is placed at the same address modulo
// 16 as the device side it pairs with, so that it is copied 16 bytes at a time when that side allows.
inline std::vector<CopyRound> plan_copies(const std::vector<CopySpan>& spans,
                                          int64_t round_bytes = kCopyRoundBytes,
                                          int64_t piece_bytes = kCopyPieceBytes) {
  std::vector<CopyRound> rounds(1);
  for (const CopySpan& s : spans) {
    const bool host = s.dst_host || s.src_host;
    for (int64_t done = 0; done < s.bytes;) {
      CopyRound* r = &rounds.back();
      int64_t take = s.bytes - done;
      int64_t at = 0;  // offset in the data area of the staged side
      if (host) {
        const uintptr_t device_side = reinterpret_cast<uintptr_t>(s.dst_host ? s.src : s.dst) + done;
        at = (r->data_bytes + 15) / 16 * 16 + static_cast<int64_t>(device_side % 16);
        if (at >= round_bytes) {  // full: a new round (round_bytes > 16, so that it takes a byte at least)
          rounds.emplace_back();
          r = &rounds.back();
          at = static_cast<int64_t>(device_side % 16);
        }
        take = std::min(take, round_bytes - at);
        if (s.dst_host) {
          r->out.push_back({s.dst + done, at, take});
        } else {
          r->in.push_back({s.src + done, at, take});
        }
        r->data_bytes = at + take;
      }
      for (int64_t p = 0; p < take; p += piece_bytes) {
        const int64_t n = std::min(piece_bytes, take - p);
        CopyPiece piece{s.src + done + p, s.dst + done + p, n};
        uint8_t flags = 0;
        if (s.src_host) {
          piece.src = reinterpret_cast<const uint8_t*>(static_cast<uintptr_t>(at + p));
          flags = CopyRound::kStagedSrc;
        } else if (s.dst_host) {
          piece.dst = reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(at + p));
          flags = CopyRound::kStagedDst;
        }
        r->pieces.push_back(piece);
        r->staged.push_back(flags);
      }
      done += take;
    }
  }
  if (rounds.back().pieces.empty()) rounds.pop_back();
  return rounds;
}

}  // namespace pd::cuda
