#include "puredrive/tokenizer/utf8.h"

#include <cstdint>

namespace pd::tok {
namespace {

struct LeadInfo {
  int width;       // 0: never valid as a lead byte
  uint8_t lo, hi;  // allowed range of the second byte
};

// Second-byte ranges exclude overlongs (E0, F0), surrogates (ED) and code points past U+10FFFF (F4).
LeadInfo lead_info(uint8_t b) {
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

enum class Scan { kValid, kInvalid, kIncomplete };

// Classifies the sequence starting at s[i] (a byte >= 0x80). `len` receives the sequence length when
// valid, the maximal-subpart length when invalid, and the available length when incomplete.
Scan scan_sequence(std::string_view s, size_t i, size_t& len) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const LeadInfo info = lead_info(p[i]);
  if (info.width == 0) {
    len = 1;
    return Scan::kInvalid;
  }
  for (int k = 1; k < info.width; ++k) {
    if (i + k >= s.size()) {
      len = s.size() - i;
      return Scan::kIncomplete;
    }
    const uint8_t c = p[i + k];
    const bool ok = k == 1 ? (c >= info.lo && c <= info.hi) : (c >= 0x80 && c <= 0xBF);
    if (!ok) {
      len = static_cast<size_t>(k);
      return Scan::kInvalid;
    }
  }
  len = static_cast<size_t>(info.width);
  return Scan::kValid;
}

}  // namespace

size_t find_invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    if (scan_sequence(s, i, len) != Scan::kValid) return i;
    i += len;
  }
  return std::string_view::npos;
}

char32_t next_code_point(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const uint8_t b = p[i];
  if (b < 0x80) {
    ++i;
    return b;
  }
  if (b < 0xE0) {
    const char32_t cp = (char32_t(b & 0x1F) << 6) | (p[i + 1] & 0x3F);
    i += 2;
    return cp;
  }
  if (b < 0xF0) {
    const char32_t cp = (char32_t(b & 0x0F) << 12) | (char32_t(p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F);
    i += 3;
    return cp;
  }
  const char32_t cp = (char32_t(b & 0x07) << 18) | (char32_t(p[i + 1] & 0x3F) << 12) |
                      (char32_t(p[i + 2] & 0x3F) << 6) | (p[i + 3] & 0x3F);
  i += 4;
  return cp;
}

size_t append_lossy_utf8(std::string_view in, std::string& out, bool final) {
  size_t i = 0;
  size_t run_start = 0;  // start of the pending run of valid bytes, copied in one go
  while (i < in.size()) {
    if (static_cast<uint8_t>(in[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    const Scan scan = scan_sequence(in, i, len);
    if (scan == Scan::kValid) {
      i += len;
      continue;
    }
    out.append(in.substr(run_start, i - run_start));
    if (scan == Scan::kIncomplete && !final) return i;
    out.append(kReplacementChar);
    i += len;
    run_start = i;
  }
  out.append(in.substr(run_start, i - run_start));
  return i;
}

}  // namespace pd::tok
