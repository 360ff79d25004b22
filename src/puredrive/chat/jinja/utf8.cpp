#include "puredrive/chat/jinja/utf8.h"

#include <utf8proc.h>

namespace pd::jinja::utf8 {

char32_t decode(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  int extra = 0;
  char32_t cp = 0;
  if ((b0 & 0xE0) == 0xC0) {
    extra = 1;
    cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    extra = 2;
    cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    extra = 3;
    cp = b0 & 0x07;
  } else {
    ++i;
    return b0;
  }
  if (i + extra >= s.size()) {
    ++i;
    return b0;
  }
  for (int k = 1; k <= extra; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) {
      ++i;
      return b0;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  i += extra + 1;
  return cp;
}

bool is_ascii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

size_t length(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size();) {
    decode(s, i);
    ++n;
  }
  return n;
}

std::vector<char32_t> to_code_points(std::string_view s) {
  std::vector<char32_t> cps;
  cps.reserve(s.size());
  for (size_t i = 0; i < s.size();) cps.push_back(decode(s, i));
  return cps;
}

std::string from_code_points(const char32_t* begin, const char32_t* end) {
  std::string out;
  out.reserve(static_cast<size_t>(end - begin));
  for (const char32_t* p = begin; p != end; ++p) append_utf8(out, *p);
  return out;
}

size_t byte_offset(std::string_view s, size_t cp_index) {
  size_t i = 0;
  for (size_t n = 0; n < cp_index && i < s.size(); ++n) decode(s, i);
  return i;
}

namespace {

utf8proc_category_t category(char32_t cp) {
  if (cp > 0x10FFFF) return UTF8PROC_CATEGORY_CN;
  return utf8proc_category(static_cast<utf8proc_int32_t>(cp));
}

}  // namespace

bool is_space(char32_t cp) {
  // Python: bidirectional class WS, B or S, or category Zs.
  if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
  switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool is_printable(char32_t cp) {
  if (cp < 0x80) return cp >= 0x20 && cp < 0x7F;
  switch (category(cp)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

bool is_alpha(char32_t cp) {
  if (cp < 0x80) return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
  switch (category(cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return true;
    default:
      return false;
  }
}

bool is_decimal(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return category(cp) == UTF8PROC_CATEGORY_ND;
}

bool is_alnum(char32_t cp) {
  if (cp < 0x80) return is_alpha(cp) || is_decimal(cp);
  if (is_alpha(cp)) return true;
  const auto c = category(cp);
  return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

bool is_word(char32_t cp) {
  return cp == '_' || is_alnum(cp);
}

bool is_cased(char32_t cp) {
  if (cp < 0x80) return is_alpha(cp);
  const auto c = category(cp);
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}

bool is_lower(char32_t cp) {
  if (cp < 0x80) return cp >= 'a' && cp <= 'z';
  return category(cp) == UTF8PROC_CATEGORY_LL;
}

bool is_upper(char32_t cp) {
  if (cp < 0x80) return cp >= 'A' && cp <= 'Z';
  const auto c = category(cp);
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LT;
}

void append_upper(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp >= 'a' && cp <= 'z' ? cp - 32 : cp));
  } else if (cp == 0xDF) {
    out += "SS";
  } else {
    append_utf8(out, static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(cp))));
  }
}

void append_lower(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp));
  } else {
    append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
  }
}

void append_title(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    append_upper(out, cp);
  } else if (cp == 0xDF) {
    out += "Ss";
  } else {
    append_utf8(out, static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(cp))));
  }
}

std::string upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) append_upper(out, decode(s, i));
  return out;
}

std::string lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) append_lower(out, decode(s, i));
  return out;
}

std::string_view strip(std::string_view s, bool left, bool right, const std::string* chars) {
  std::vector<char32_t> set;
  if (chars != nullptr) set = to_code_points(*chars);
  auto strippable = [&](char32_t cp) {
    if (chars == nullptr) return is_space(cp);
    for (char32_t c : set) {
      if (c == cp) return true;
    }
    return false;
  };
  size_t begin = 0;
  size_t end = s.size();
  if (left) {
    while (begin < end) {
      size_t next = begin;
      if (!strippable(decode(s, next))) break;
      begin = next;
    }
  }
  if (right) {
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
      size_t probe = start;
      const char32_t cp = decode(s, probe);
      if (probe != end) {
        // A stray continuation byte: treat the last byte as one code point on its own.
        start = end - 1;
        probe = start;
        const char32_t raw = decode(s, probe);
        if (!strippable(raw)) break;
        end = start;
        continue;
      }
      if (!strippable(cp)) break;
      end = start;
    }
  }
  return s.substr(begin, end - begin);
}

}  // namespace pd::jinja::utf8
