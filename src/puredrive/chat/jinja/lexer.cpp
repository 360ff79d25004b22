#include "puredrive/chat/jinja/lexer.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "puredrive/chat/jinja/error.h"
#include "puredrive/chat/jinja/utf8.h"

namespace pd::jinja {

const char* op_text(Op op) {
  switch (op) {
    case Op::kAdd:
      return "+";
    case Op::kSub:
      return "-";
    case Op::kMul:
      return "*";
    case Op::kDiv:
      return "/";
    case Op::kFloorDiv:
      return "//";
    case Op::kMod:
      return "%";
    case Op::kPow:
      return "**";
    case Op::kTilde:
      return "~";
    case Op::kLBracket:
      return "[";
    case Op::kRBracket:
      return "]";
    case Op::kLParen:
      return "(";
    case Op::kRParen:
      return ")";
    case Op::kLBrace:
      return "{";
    case Op::kRBrace:
      return "}";
    case Op::kEq:
      return "==";
    case Op::kNe:
      return "!=";
    case Op::kGt:
      return ">";
    case Op::kGtEq:
      return ">=";
    case Op::kLt:
      return "<";
    case Op::kLtEq:
      return "<=";
    case Op::kAssign:
      return "=";
    case Op::kDot:
      return ".";
    case Op::kColon:
      return ":";
    case Op::kPipe:
      return "|";
    case Op::kComma:
      return ",";
    case Op::kSemicolon:
      return ";";
    case Op::kNone:
      break;
  }
  return "?";
}

namespace {

enum class TagKind { kVariable, kBlock, kComment, kRaw };

class Lexer {
 public:
  explicit Lexer(std::string_view raw) { normalize(raw); }

  std::vector<Token> run() {
    while (pos_ < src_.size()) lex_root();
    push(TokenType::kEof, pos_);
    return std::move(tokens_);
  }

 private:
  // jinja2 splits on \r\n, \r, \n, joins with \n and drops one trailing newline (keep_trailing_newline).
  void normalize(std::string_view raw) {
    src_.reserve(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] == '\r') {
        if (i + 1 < raw.size() && raw[i + 1] == '\n') ++i;
        src_.push_back('\n');
      } else {
        src_.push_back(raw[i]);
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  // Line and column (in code points) of a byte offset. Tokens come in increasing order, so the column
  // is counted on from the previous token when it is on the same line (long one-line templates stay linear).
  void locate(size_t offset, int& line, int& column) {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t idx = static_cast<size_t>(it - line_starts_.begin()) - 1;
    line = static_cast<int>(idx) + 1;
    size_t from = line_starts_[idx];
    int col = 1;
    if (last_line_ == line && last_offset_ <= offset && last_offset_ >= from) {
      from = last_offset_;
      col = last_column_;
    }
    column = col + static_cast<int>(utf8::length(std::string_view(src_).substr(from, offset - from)));
    last_line_ = line;
    last_offset_ = offset;
    last_column_ = column;
  }

  [[noreturn]] void error_at(size_t offset, const std::string& message) {
    int line = 0;
    int column = 0;
    locate(offset, line, column);
    throw TemplateError(ErrorKind::kSyntax, message, line, column);
  }

  Token& push(TokenType type, size_t offset) {
    Token t;
    t.type = type;
    locate(offset, t.line, t.column);
    tokens_.push_back(std::move(t));
    return tokens_.back();
  }

  bool starts_with(size_t at, std::string_view s) const { return src_.compare(at, s.size(), s) == 0; }

  // Python's \s (str.isspace) at `at`; returns the byte length of the whitespace char or 0.
  size_t space_len(size_t at) const {
    if (at >= src_.size()) return 0;
    const auto c = static_cast<unsigned char>(src_[at]);
    if (c < 0x80) return utf8::is_space(c) ? 1 : 0;
    size_t i = at;
    const char32_t cp = utf8::decode(src_, i);
    return utf8::is_space(cp) ? i - at : 0;
  }

  size_t skip_spaces(size_t at) const {
    while (size_t n = space_len(at)) at += n;
    return at;
  }

  // Matches `{%(-|+|)\s*raw\s*(-%}\s*|%})` at `at`; returns the end offset or npos.
  size_t match_raw_begin(size_t at) const {
    size_t p = at + 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    p = skip_spaces(p);
    if (!starts_with(p, "raw")) return std::string::npos;
    p = skip_spaces(p + 3);
    if (starts_with(p, "-%}")) return skip_spaces(p + 3);
    if (starts_with(p, "%}")) return p + 2;
    return std::string::npos;
  }

  // Text before a tag, with the tag's whitespace control applied (jinja2's OptionalLStrip).
  void emit_text(size_t begin, size_t end, char sign, bool lstrip_allowed) {
    std::string_view text(src_.data() + begin, end - begin);
    if (sign == '-') {
      text = utf8::strip(text, false, true, nullptr);
    } else if (sign != '+' && lstrip_allowed) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
      if (l_pos > 0 || line_starting_) {
        const std::string_view tail = text.substr(l_pos);
        if (!tail.empty() && utf8::strip(tail, true, false, nullptr).empty()) text = text.substr(0, l_pos);
      }
    }
    if (!text.empty()) push(TokenType::kData, begin).text = std::string(text);
  }

  void lex_root() {
    // Find the next tag start: {{, {% or {#.
    size_t tag = pos_;
    TagKind kind = TagKind::kVariable;
    for (;;) {
      tag = src_.find('{', tag);
      if (tag == std::string::npos || tag + 1 >= src_.size()) {
        tag = std::string::npos;
        break;
      }
      const char c = src_[tag + 1];
      if (c == '{') {
        kind = TagKind::kVariable;
        break;
      }
      if (c == '%') {
        kind = match_raw_begin(tag) != std::string::npos ? TagKind::kRaw : TagKind::kBlock;
        break;
      }
      if (c == '#') {
        kind = TagKind::kComment;
        break;
      }
      ++tag;
    }
    if (tag == std::string::npos) {
      push(TokenType::kData, pos_).text = src_.substr(pos_);
      pos_ = src_.size();
      return;
    }
    const char sign =
        (tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+')) ? src_[tag + 2] : 0;
    emit_text(pos_, tag, sign, kind != TagKind::kVariable);
    switch (kind) {
      case TagKind::kComment:
        lex_comment(tag, sign);
        break;
      case TagKind::kRaw:
        lex_raw(tag);
        break;
      case TagKind::kVariable:
      case TagKind::kBlock:
        lex_tag(tag, kind, sign);
        break;
    }
  }

  void lex_comment(size_t tag, char sign) {
    size_t p = tag + 2 + (sign ? 1 : 0);
    const size_t close = src_.find("#}", p);
    if (close == std::string::npos) error_at(tag, "Missing end of comment tag");
    // The lazy (.*?) of jinja2 stops at the first position where +#}, -#}\s* or #}\n? matches.
    if (close > p && src_[close - 1] == '-') {
      pos_ = skip_spaces(close + 2);
    } else if (close > p && src_[close - 1] == '+') {
      pos_ = close + 2;
    } else {
      pos_ = close + 2;
      if (pos_ < src_.size() && src_[pos_] == '\n') ++pos_;
    }
    line_starting_ = pos_ > 0 && src_[pos_ - 1] == '\n';
  }

  void lex_raw(size_t tag) {
    const size_t body = match_raw_begin(tag);
    // Find {%(-|+|)\s*endraw\s*(+%}|-%}\s*|%}\n?)
    for (size_t p = src_.find("{%", body); p != std::string::npos; p = src_.find("{%", p + 1)) {
      size_t q = p + 2;
      const char sign = (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ? src_[q] : 0;
      if (sign) ++q;
      q = skip_spaces(q);
      if (!starts_with(q, "endraw")) continue;
      q = skip_spaces(q + 6);
      size_t end = std::string::npos;
      if (starts_with(q, "+%}")) {
        end = q + 3;
      } else if (starts_with(q, "-%}")) {
        end = skip_spaces(q + 3);
      } else if (starts_with(q, "%}")) {
        end = q + 2;
        if (end < src_.size() && src_[end] == '\n') ++end;
      }
      if (end == std::string::npos) continue;
      line_starting_ = body > 0 && src_[body - 1] == '\n';
      emit_text(body, p, sign, true);
      pos_ = end;
      line_starting_ = pos_ > 0 && src_[pos_ - 1] == '\n';
      return;
    }
    error_at(tag, "Missing end of raw directive");
  }

  void lex_tag(size_t tag, TagKind kind, char sign) {
    push(kind == TagKind::kVariable ? TokenType::kVarBegin : TokenType::kBlockBegin, tag);
    size_t p = tag + 2 + (sign ? 1 : 0);
    std::vector<char> balance;
    for (;;) {
      if (p >= src_.size()) {
        error_at(tag, kind == TagKind::kVariable ? "unexpected end of template, expected '}}'"
                                                 : "unexpected end of template, expected '%}'");
      }
      if (balance.empty()) {
        size_t end = std::string::npos;
        if (kind == TagKind::kBlock) {
          if (starts_with(p, "+%}")) {
            end = p + 3;
          } else if (starts_with(p, "-%}")) {
            end = skip_spaces(p + 3);
          } else if (starts_with(p, "%}")) {
            end = p + 2;
            if (end < src_.size() && src_[end] == '\n') ++end;  // trim_blocks
          }
        } else {
          if (starts_with(p, "-}}")) {
            end = skip_spaces(p + 3);
          } else if (starts_with(p, "}}")) {
            end = p + 2;
          }
        }
        if (end != std::string::npos) {
          push(kind == TagKind::kVariable ? TokenType::kVarEnd : TokenType::kBlockEnd, p);
          pos_ = end;
          line_starting_ = src_[pos_ - 1] == '\n';
          return;
        }
      }
      if (size_t n = space_len(p)) {
        p += n;
        continue;
      }
      p = lex_expression_token(p, balance);
    }
  }

  static bool is_digit(char c) { return c >= '0' && c <= '9'; }
  static bool is_name_start(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
           static_cast<unsigned char>(c) >= 0x80;
  }
  static bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

  // (\d+_)*\d+ : digits with single underscores between them. Returns end or npos.
  size_t match_digits(size_t p) const {
    if (p >= src_.size() || !is_digit(src_[p])) return std::string::npos;
    while (p < src_.size()) {
      while (p < src_.size() && is_digit(src_[p])) ++p;
      if (p + 1 < src_.size() && src_[p] == '_' && is_digit(src_[p + 1])) {
        ++p;
        continue;
      }
      break;
    }
    return p;
  }

  size_t match_float(size_t p) const {
    if (p > 0 && src_[p - 1] == '.') return std::string::npos;
    size_t q = match_digits(p);
    if (q == std::string::npos) return q;
    size_t frac_end = std::string::npos;
    if (q < src_.size() && src_[q] == '.') frac_end = match_digits(q + 1);
    auto exponent = [&](size_t e) -> size_t {
      if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
        size_t s = e + 1;
        if (s < src_.size() && (src_[s] == '+' || src_[s] == '-')) ++s;
        return match_digits(s);
      }
      return std::string::npos;
    };
    if (frac_end != std::string::npos) {
      const size_t with_exp = exponent(frac_end);
      return with_exp != std::string::npos ? with_exp : frac_end;
    }
    return exponent(q);
  }

  size_t match_integer(size_t p, int64_t& value) {
    auto digits_of = [&](size_t s, int base) -> size_t {
      // (_?[digit])+
      size_t q = s;
      bool any = false;
      while (q < src_.size()) {
        size_t r = q;
        if (src_[r] == '_') ++r;
        if (r >= src_.size()) break;
        const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(src_[r])));
        const bool ok = base == 16 ? (is_digit(c) || (c >= 'a' && c <= 'f')) : (c >= '0' && c < '0' + base);
        if (!ok) break;
        q = r + 1;
        any = true;
      }
      return any ? q : std::string::npos;
    };
    size_t end = std::string::npos;
    int base = 10;
    if (src_[p] == '0' && p + 1 < src_.size()) {
      const char x = static_cast<char>(std::tolower(static_cast<unsigned char>(src_[p + 1])));
      base = x == 'b' ? 2 : x == 'o' ? 8 : x == 'x' ? 16 : 10;
      if (base != 10) end = digits_of(p + 2, base);
      if (end == std::string::npos) base = 10;
    }
    if (base == 10) {
      if (src_[p] >= '1' && src_[p] <= '9') {
        end = p + 1;
        const size_t rest = digits_of(p + 1, 10);
        if (rest != std::string::npos) end = rest;
      } else if (src_[p] == '0') {
        end = p + 1;
        // 0(_?0)*
        while (end < src_.size()) {
          size_t r = end;
          if (src_[r] == '_') ++r;
          if (r < src_.size() && src_[r] == '0') {
            end = r + 1;
          } else {
            break;
          }
        }
      } else {
        return std::string::npos;
      }
    }
    std::string digits;
    for (size_t i = p + (base == 10 ? 0 : 2); i < end; ++i) {
      if (src_[i] != '_') digits.push_back(src_[i]);
    }
    auto res = std::from_chars(digits.data(), digits.data() + digits.size(), value, base);
    if (res.ec != std::errc()) error_at(p, "integer literal out of range");
    return end;
  }

  // Python 'unicode-escape' decoding of a string literal body (after jinja2 turned every non-ASCII
  // character into a \x/\u/\U escape with 'backslashreplace').
  std::string unescape(std::string_view body, size_t offset) {
    std::string out;
    out.reserve(body.size());
    for (size_t i = 0; i < body.size();) {
      const char c = body[i];
      if (c != '\\') {
        const size_t start = i;
        utf8::decode(body, i);
        out.append(body.substr(start, i - start));
        continue;
      }
      if (i + 1 >= body.size()) error_at(offset, "\\ at end of string");
      const char e = body[i + 1];
      i += 2;
      switch (e) {
        case '\n':
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t k = 0; k < n; ++k) {
            if (i + k >= body.size() || !std::isxdigit(static_cast<unsigned char>(body[i + k]))) {
              error_at(offset, e == 'x'   ? "truncated \\xXX escape"
                               : e == 'u' ? "truncated \\uXXXX escape"
                                          : "truncated \\UXXXXXXXX escape");
            }
            const char h = body[i + k];
            cp = cp * 16 + static_cast<uint32_t>(is_digit(h) ? h - '0' : (std::tolower(h) - 'a' + 10));
          }
          if (cp > 0x10FFFF) error_at(offset, "illegal Unicode character");
          i += n;
          append_utf8(out, cp);
          break;
        }
        case 'N':
          error_at(offset, "\\N{...} escapes are not supported");
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && i < body.size() && body[i] >= '0' && body[i] <= '7'; ++k, ++i) {
              cp = cp * 8 + static_cast<uint32_t>(body[i] - '0');
            }
            append_utf8(out, cp);
          } else if (static_cast<unsigned char>(e) >= 0x80) {
            // backslash + non-ASCII: backslashreplace produced "\\xNN"-style text, which decodes to a
            // literal backslash followed by the escape's letters.
            size_t j = i - 1;
            const char32_t cp = utf8::decode(body, j);
            i = j;
            out.push_back('\\');
            if (cp <= 0xFF) {
              out += fmt::format("x{:02x}", static_cast<unsigned>(cp));
            } else if (cp <= 0xFFFF) {
              out += fmt::format("u{:04x}", static_cast<unsigned>(cp));
            } else {
              out += fmt::format("U{:08x}", static_cast<unsigned>(cp));
            }
          } else {
            out.push_back('\\');  // unknown escapes stay as written
            out.push_back(e);
          }
      }
    }
    return out;
  }

  size_t lex_expression_token(size_t p, std::vector<char>& balance) {
    const char c = src_[p];
    if (is_digit(c)) {
      const size_t f = match_float(p);
      if (f != std::string::npos) {
        std::string text;
        for (size_t i = p; i < f; ++i) {
          if (src_[i] != '_') text.push_back(src_[i]);
        }
        Token& t = push(TokenType::kFloat, p);
        t.float_value = std::strtod(text.c_str(), nullptr);
        return f;
      }
      int64_t value = 0;
      const size_t e = match_integer(p, value);
      if (e != std::string::npos) {
        push(TokenType::kInteger, p).int_value = value;
        return e;
      }
    }
    if (is_name_start(c)) {
      size_t e = p;
      while (e < src_.size() && is_name_char(src_[e])) ++e;
      push(TokenType::kName, p).text = src_.substr(p, e - p);
      return e;
    }
    if (c == '\'' || c == '"') {
      size_t e = p + 1;
      while (e < src_.size() && src_[e] != c) {
        if (src_[e] == '\\') ++e;
        ++e;
      }
      if (e >= src_.size()) error_at(p, "unexpected char '" + std::string(1, c) + "'");
      std::string value = unescape(std::string_view(src_).substr(p + 1, e - p - 1), p);
      push(TokenType::kString, p).text = std::move(value);
      return e + 1;
    }
    static constexpr std::pair<std::string_view, Op> kOps[] = {
        {"//", Op::kFloorDiv}, {"**", Op::kPow},     {"==", Op::kEq},    {"!=", Op::kNe},
        {">=", Op::kGtEq},     {"<=", Op::kLtEq},    {"+", Op::kAdd},    {"-", Op::kSub},
        {"/", Op::kDiv},       {"*", Op::kMul},      {"%", Op::kMod},    {"~", Op::kTilde},
        {"[", Op::kLBracket},  {"]", Op::kRBracket}, {"(", Op::kLParen}, {")", Op::kRParen},
        {"{", Op::kLBrace},    {"}", Op::kRBrace},   {">", Op::kGt},     {"<", Op::kLt},
        {"=", Op::kAssign},    {".", Op::kDot},      {":", Op::kColon},  {"|", Op::kPipe},
        {",", Op::kComma},     {";", Op::kSemicolon}};
    for (const auto& [text, op] : kOps) {
      if (!starts_with(p, text)) continue;
      if (op == Op::kLBrace || op == Op::kLBracket || op == Op::kLParen) {
        balance.push_back(op == Op::kLBrace ? '}' : op == Op::kLBracket ? ']' : ')');
      } else if (op == Op::kRBrace || op == Op::kRBracket || op == Op::kRParen) {
        if (balance.empty()) error_at(p, fmt::format("unexpected '{}'", text));
        const char expected = balance.back();
        balance.pop_back();
        if (expected != text[0]) error_at(p, fmt::format("unexpected '{}', expected '{}'", text, expected));
      }
      push(TokenType::kOperator, p).op = op;
      return p + text.size();
    }
    std::string shown;
    py_repr_char(p, shown);
    error_at(p, fmt::format("unexpected char {} at {}", shown, p));
  }

  void py_repr_char(size_t p, std::string& out) const {
    size_t i = p;
    utf8::decode(src_, i);
    out = "'" + src_.substr(p, i - p) + "'";
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
  int last_line_ = 0;
  size_t last_offset_ = 0;
  int last_column_ = 1;
  size_t pos_ = 0;
  bool line_starting_ = true;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) {
  return Lexer(source).run();
}

}  // namespace pd::jinja
