#include "puredrive/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstring>
#include <string_view>

#include "puredrive/tokenizer/utf8.h"

namespace pd::tok {
namespace {

struct CategoryRange {
  char32_t lo, hi;
  const char* category;  // two-letter general category
};

// Code points assigned after PCRE2's Unicode version, with the category the reference gives them.
constexpr CategoryRange kNewerCategories[] = {
#include "puredrive/tokenizer/unicode_delta.inc"
};

bool is_general_category(std::string_view name) {
  static constexpr std::string_view kNames[] = {"L",  "Lu", "Ll", "Lt", "Lm", "Lo", "LC", "L&", "M",  "Mn",
                                                "Mc", "Me", "N",  "Nd", "Nl", "No", "P",  "Pc", "Pd", "Ps",
                                                "Pe", "Pi", "Pf", "Po", "S",  "Sm", "Sc", "Sk", "So", "Z",
                                                "Zs", "Zl", "Zp", "C",  "Cc", "Cf", "Cs", "Co", "Cn"};
  for (auto n : kNames) {
    if (n == name) return true;
  }
  return false;
}

bool category_in(std::string_view cat, std::string_view set) {
  if (set.size() == 1) return cat[0] == set[0];
  if (set == "LC" || set == "L&") return cat == "Lu" || cat == "Ll" || cat == "Lt";
  return cat == set;
}

// Class items (no brackets) for the newer code points of the given categories.
std::string newer_items(std::initializer_list<std::string_view> sets) {
  std::string items;
  for (const auto& r : kNewerCategories) {
    bool hit = false;
    for (auto s : sets) hit = hit || category_in(r.category, s);
    if (!hit) continue;
    if (r.lo == r.hi) {
      items += fmt::format("\\x{{{:X}}}", static_cast<uint32_t>(r.lo));
    } else {
      items +=
          fmt::format("\\x{{{:X}}}-\\x{{{:X}}}", static_cast<uint32_t>(r.lo), static_cast<uint32_t>(r.hi));
    }
  }
  return items;
}

// A set of characters as PCRE2 class items. `single` is the lone item usable negated inside a class
// (\P{..}) when no newer code points have to be added.
struct CharSet {
  std::string items;
  std::string negated_single;  // empty when the set cannot be negated inside a class
};

CharSet property_set(std::string_view name) {
  if (!is_general_category(name)) {
    // Scripts and binary properties: PCRE2's own tables.
    return {fmt::format("\\p{{{}}}", name), fmt::format("\\P{{{}}}", name)};
  }
  std::string extra = newer_items({name});
  std::string items = fmt::format("\\p{{{}}}", name) + extra;
  return {items, extra.empty() ? fmt::format("\\P{{{}}}", name) : std::string()};
}

// Oniguruma's \w: letters, marks, numbers, connector punctuation (PCRE2 10.42's lacks marks and Pc).
CharSet word_set() {
  return {"\\p{L}\\p{M}\\p{N}\\p{Pc}" + newer_items({"L", "M", "N", "Pc"}), ""};
}

Status unsupported(std::string_view pattern, size_t pos, std::string_view what) {
  return make_error(ErrorCode::kUnsupported, "regex '{}': {} at offset {} is not supported", pattern, what,
                    pos);
}

bool is_hex(char c) {
  return std::isxdigit(static_cast<unsigned char>(c)) != 0;
}

}  // namespace

Expected<std::string> translate_oniguruma_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() * 2);
  bool in_class = false;
  size_t i = 0;

  auto emit_set = [&](const CharSet& set, bool negated, size_t pos, std::string_view esc) -> Status {
    if (!in_class) {
      out += negated ? "[^" : "[";
      out += set.items;
      out += "]";
    } else if (!negated) {
      out += set.items;
    } else if (!set.negated_single.empty()) {
      out += set.negated_single;
    } else {
      return unsupported(p, pos, fmt::format("{} inside a character class", esc));
    }
    return Status::ok();
  };

  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 >= p.size()) return make_error(ErrorCode::kCorrupt, "regex '{}': trailing backslash", p);
      const char e = p[i + 1];
      const size_t pos = i;
      i += 2;
      switch (e) {
        case 's':
        case 'S':
          PD_TRY(emit_set({"\\p{White_Space}", "\\P{White_Space}"}, e == 'S', pos, "\\S"));
          break;
        case 'w':
        case 'W':
          PD_TRY(emit_set(word_set(), e == 'W', pos, "\\W"));
          break;
        case 'd':
        case 'D':
          PD_TRY(emit_set(property_set("Nd"), e == 'D', pos, "\\D"));
          break;
        case 'h':
        case 'H':  // Oniguruma: hexadecimal digit (PCRE2: horizontal space)
          PD_TRY(emit_set({"0-9a-fA-F", ""}, e == 'H', pos, "\\H"));
          break;
        case 'p':
        case 'P': {
          bool negated = e == 'P';
          std::string name;
          if (i < p.size() && p[i] == '{') {
            const size_t close = p.find('}', i);
            if (close == std::string_view::npos) {
              return make_error(ErrorCode::kCorrupt, "regex '{}': unterminated \\{}{{ at offset {}", p, e,
                                pos);
            }
            name = std::string(p.substr(i + 1, close - i - 1));
            i = close + 1;
          } else if (i < p.size()) {
            name = std::string(1, p[i]);
            ++i;
          } else {
            return make_error(ErrorCode::kCorrupt, "regex '{}': \\{} without a property name", p, e);
          }
          if (!name.empty() && name[0] == '^') {
            negated = !negated;
            name.erase(0, 1);
          }
          PD_TRY(emit_set(property_set(name), negated, pos, fmt::format("\\P{{{}}}", name)));
          break;
        }
        case 'u': {  // Oniguruma \uHHHH
          if (i + 4 > p.size() || !is_hex(p[i]) || !is_hex(p[i + 1]) || !is_hex(p[i + 2]) ||
              !is_hex(p[i + 3])) {
            return make_error(ErrorCode::kCorrupt, "regex '{}': bad \\u escape at offset {}", p, pos);
          }
          out += fmt::format("\\x{{{}}}", p.substr(i, 4));
          i += 4;
          break;
        }
        case 'b':
        case 'B':
          return unsupported(p, pos, fmt::format("word boundary \\{}", e));
        default:
          out += c;
          out += e;
          break;
      }
      continue;
    }
    if (in_class) {
      if (c == '[') {
        if (i + 1 < p.size() && p[i + 1] == ':') {
          const size_t close = p.find(":]", i + 2);
          if (close == std::string_view::npos) return unsupported(p, i, "unterminated POSIX class");
          out += p.substr(i, close + 2 - i);
          i = close + 2;
          continue;
        }
        return unsupported(p, i, "nested character class");
      }
      if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') return unsupported(p, i, "class intersection &&");
      if (c == ']') in_class = false;
      out += c;
      ++i;
      continue;
    }
    if (c == '[') {
      in_class = true;
      out += c;
      ++i;
      if (i < p.size() && p[i] == '^') out += p[i++];
      if (i < p.size() && p[i] == ']') out += p[i++];  // a leading ']' is literal
      continue;
    }
    if (c == '(' && i + 1 < p.size() && p[i + 1] == '?') {
      // Inline options: Oniguruma's (?m) is PCRE2's (?s) (dot matches newline).
      size_t j = i + 2;
      while (j < p.size() && std::strchr("imx-", p[j]) != nullptr) ++j;
      if (j > i + 2 && j < p.size() && (p[j] == ':' || p[j] == ')')) {
        out += "(?";
        for (size_t k = i + 2; k < j; ++k) out += p[k] == 'm' ? 's' : p[k];
        i = j;
        continue;
      }
    }
    out += c;
    ++i;
  }
  if (in_class) return make_error(ErrorCode::kCorrupt, "regex '{}': unterminated character class", p);
  return out;
}

Expected<std::shared_ptr<const Regex>> Regex::compile(std::string_view pattern) {
  PD_ASSIGN_OR_RETURN(std::string translated, translate_oniguruma_pattern(pattern));
  pcre2_compile_context* ctx = pcre2_compile_context_create(nullptr);
  pcre2_set_newline(ctx, PCRE2_NEWLINE_LF);
  int err = 0;
  PCRE2_SIZE err_off = 0;
  // MULTILINE: Oniguruma's ^ and $ always match at line boundaries.
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &err_off, ctx);
  pcre2_compile_context_free(ctx);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return make_error(ErrorCode::kUnsupported, "regex '{}': PCRE2 rejects its translation at offset {}: {}",
                      pattern, err_off, reinterpret_cast<const char*>(msg));
  }
  // JIT is an optimisation; the interpreter gives the same matches when it is unavailable.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  std::shared_ptr<Regex> re(new Regex());
  re->pattern_ = std::string(pattern);
  re->code_ = code;
  return std::shared_ptr<const Regex>(std::move(re));
}

Regex::~Regex() {
  pcre2_code_free(code_);
}

namespace {

// Per-thread match scratch: match data with one pair of offsets and a JIT stack large enough for long
// runs of backtracking (e.g. \s+(?!\S) over megabytes of spaces).
struct MatchScratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  pcre2_match_context* ctx = pcre2_match_context_create(nullptr);
  MatchScratch() { pcre2_jit_stack_assign(ctx, nullptr, stack); }
  ~MatchScratch() {
    pcre2_match_context_free(ctx);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;
};

}  // namespace

Status Regex::find_all(std::string_view text, std::vector<Span>& out) const {
  thread_local MatchScratch scratch;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t search_from = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  while (search_from <= text.size()) {
    const int rc =
        pcre2_match(code_, subject, text.size(), search_from, PCRE2_NO_UTF_CHECK, scratch.data, scratch.ctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      return make_error(ErrorCode::kInvalidArgument, "regex '{}': matching failed on a {}-byte text: {}",
                        pattern_, text.size(), reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.data);
    const size_t s = ov[0];
    const size_t e = ov[1];
    if (s == e && have_last && last_match_end == e) {
      if (search_from >= text.size()) break;
      size_t next = search_from;
      next_code_point(text, next);
      search_from = next;
      continue;
    }
    out.emplace_back(s, e);
    search_from = e;
    have_last = true;
    last_match_end = e;
  }
  return Status::ok();
}

bool is_white_space(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

bool is_word_char(char32_t cp) {
  // Rust regex's \w (what HF's single_word check uses): Alphabetic, marks, decimal numbers, connector
  // punctuation and joiners; unlike Oniguruma's \w it excludes other numbers (No) such as '²'.
  static const std::shared_ptr<const Regex> word = [] {
    auto re = Regex::compile("[\\p{Alphabetic}\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]");
    PD_ASSERT(re.has_value(), "cannot compile the word class: {}", re.status().to_string());
    return *re;
  }();
  std::string s;
  append_utf8(s, cp);
  std::vector<Span> spans;
  if (!word->find_all(s, spans).is_ok()) return false;
  return !spans.empty();
}

}  // namespace pd::tok
