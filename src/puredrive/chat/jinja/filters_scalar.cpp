// jinja2's builtin filters on strings and numbers (jinja2/filters.py, 3.1); filters.cpp names them.
#include <cmath>
#include <cstdlib>

#include "puredrive/chat/jinja/filters.h"
#include "puredrive/chat/jinja/objects.h"
#include "puredrive/chat/jinja/parser.h"
#include "puredrive/chat/jinja/py_format.h"
#include "puredrive/chat/jinja/utf8.h"

namespace pd::jinja::filters {
namespace {

std::string apply_title(const std::string& s) {
  // do_title: split on runs of [-\s({\[<], upper-case each piece's first char, lower-case the rest.
  auto is_sep = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || utf8::is_space(c);
  };
  std::string out;
  bool at_start = true;
  for (size_t i = 0; i < s.size();) {
    const char32_t cp = utf8::decode(s, i);
    if (is_sep(cp)) {
      append_utf8(out, cp);
      at_start = true;
    } else if (at_start) {
      utf8::append_upper(out, cp);
      at_start = false;
    } else {
      utf8::append_lower(out, cp);
    }
  }
  return out;
}

// Python str.splitlines() for the indent filter.
std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < s.size();) {
    const size_t at = i;
    const char32_t cp = utf8::decode(s, i);
    const bool is_break = cp == '\n' || cp == '\r' || cp == '\v' || cp == '\f' || cp == 0x1C || cp == 0x1D ||
                          cp == 0x1E || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (!is_break) continue;
    lines.push_back(s.substr(start, at - start));
    if (cp == '\r' && i < s.size() && s[i] == '\n') ++i;
    start = i;
  }
  if (start < s.size()) lines.push_back(s.substr(start));
  return lines;
}

// Python float(str): strips whitespace, accepts inf/nan spellings; false when not a float literal.
bool parse_py_float(const std::string& text, double& out) {
  const std::string t(utf8::strip(text, true, true, nullptr));
  if (t.empty()) return false;
  std::string clean;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '_') {
      if (i == 0 || i + 1 >= t.size() || !std::isdigit(static_cast<unsigned char>(t[i - 1])) ||
          !std::isdigit(static_cast<unsigned char>(t[i + 1]))) {
        return false;
      }
      continue;
    }
    clean.push_back(t[i]);
  }
  const std::string lower = utf8::lower(clean);
  const size_t sign = (!lower.empty() && (lower[0] == '+' || lower[0] == '-')) ? 1 : 0;
  const std::string body = lower.substr(sign);
  if (body == "inf" || body == "infinity" || body == "nan") {
    out = body == "nan" ? NAN : INFINITY;
    if (lower[0] == '-') out = -out;
    return true;
  }
  if (body.find_first_of("xp") != std::string::npos) return false;  // strtod would accept hex floats
  char* end = nullptr;
  out = std::strtod(clean.c_str(), &end);
  return end == clean.c_str() + clean.size();
}

// Python int(str, base).
bool parse_py_int(const std::string& text, int64_t base, int64_t& out) {
  std::string t(utf8::strip(text, true, true, nullptr));
  bool neg = false;
  if (!t.empty() && (t[0] == '+' || t[0] == '-')) {
    neg = t[0] == '-';
    t.erase(0, 1);
  }
  if (t.size() > 1 && t[0] == '0') {
    const char p = static_cast<char>(std::tolower(static_cast<unsigned char>(t[1])));
    const int64_t prefix_base = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (prefix_base != 0 && (base == prefix_base || base == 0)) {
      t.erase(0, 2);
      if (!t.empty() && t[0] == '_') t.erase(0, 1);
      base = prefix_base;
    }
  }
  if (base == 0) base = 10;
  if (t.empty() || t.front() == '_' || t.back() == '_') return false;
  uint64_t v = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '_') {
      if (t[i - 1] == '_') return false;
      continue;
    }
    const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(t[i])));
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    if (c >= 'a' && c <= 'z') d = c - 'a' + 10;
    if (d < 0 || d >= base) return false;
    if (v > (UINT64_MAX - static_cast<uint64_t>(d)) / static_cast<uint64_t>(base)) {
      fail(ErrorKind::kValue, "integer literal too large: {}", text);
    }
    v = v * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
  }
  if (v > static_cast<uint64_t>(INT64_MAX)) fail(ErrorKind::kValue, "integer literal too large: {}", text);
  out = neg ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
  return true;
}

double py_round(double x, int64_t ndigits) {
  if (!std::isfinite(x)) return x;
  if (ndigits == 0) return std::nearbyint(x);  // round-half-even on the exact binary value, as Python
  if (ndigits > 0) {
    if (ndigits > 300) return x;
    // Correctly rounded decimal conversion, like Python's dtoa-based round().
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(ndigits), x);
    return std::strtod(buf, nullptr);
  }
  const double p = std::pow(10.0, static_cast<double>(-ndigits));
  return std::nearbyint(x / p) * p;
}

}  // namespace

Value f_abs(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_float()) return Value::from_float(std::fabs(v.as_float()));
  if (v.is_int() || v.is_bool()) {
    if (v.as_int() == INT64_MIN) fail(ErrorKind::kValue, "integer overflow");
    return Value::from_int(std::llabs(v.as_int()));
  }
  if (v.is_undefined()) raise_undefined(v);
  fail(ErrorKind::kType, "bad operand type for abs(): '{}'", v.type_name());
}

Value f_capitalize(Interpreter& interp, const Value& v, CallArgs& args) {
  CallArgs none;
  (void)args;
  return call_method(interp, Value::from_string(soft_str(v)), "capitalize", none);
}

Value f_center(Interpreter& interp, const Value& v, CallArgs& args) {
  ArgBinder b("center", args, {"width"});
  CallArgs a;
  a.args.push_back(Value::from_int(int_arg(b.get(0), 80, "width")));
  return call_method(interp, Value::from_string(soft_str(v)), "center", a);
}

Value f_escape(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_safe()) return v;
  return Value::from_string(html_escape(soft_str(v)), true);
}

Value f_forceescape(Interpreter&, const Value& v, CallArgs&) {
  return Value::from_string(html_escape(soft_str(v)), true);
}

Value f_filesizeformat(Interpreter&, const Value& v, CallArgs& args) {
  ArgBinder b("filesizeformat", args, {"binary"});
  const bool binary = b.has(0) && b.get(0)->truthy();
  double bytes = 0;
  if (v.is_number()) {
    bytes = v.as_float();
  } else if (!v.is_string() || !parse_py_float(v.str(), bytes)) {
    fail(ErrorKind::kValue, "could not convert {} to float", py_repr(v));
  }
  const double base = binary ? 1024 : 1000;
  static const char* const kBin[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
  static const char* const kDec[] = {"kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"};
  if (bytes == 1) return str_result("1 Byte");
  if (bytes < base) return str_result(fmt::format("{} Bytes", static_cast<int64_t>(bytes)));
  double unit = 0;
  for (int i = 0; i < 8; ++i) {
    unit = std::pow(base, i + 2);
    if (bytes < unit || i == 7) {
      return str_result(format_value(Value::from_float(base * bytes / unit), ".1f") + " " +
                        (binary ? kBin[i] : kDec[i]));
    }
  }
  return str_result("");
}

Value f_float(Interpreter&, const Value& v, CallArgs& args) {
  ArgBinder b("float", args, {"default"});
  if (v.is_number()) return Value::from_float(v.as_float());
  double d = 0;
  if (v.is_string() && parse_py_float(v.str(), d)) return Value::from_float(d);
  return b.value_or(0, Value::from_float(0.0));
}

Value f_int(Interpreter&, const Value& v, CallArgs& args) {
  ArgBinder b("int", args, {"default", "base"});
  const Value fallback = b.value_or(0, Value::from_int(0));
  if (v.is_int() || v.is_bool()) return Value::from_int(v.as_int());
  if (v.is_float()) {
    const double d = v.as_float();
    if (!std::isfinite(d)) return fallback;
    if (std::fabs(d) >= 9.2e18) fail(ErrorKind::kValue, "integer too large");
    return Value::from_int(static_cast<int64_t>(d));
  }
  if (v.is_string()) {
    int64_t i = 0;
    if (parse_py_int(v.str(), int_arg(b.get(1), 10, "base"), i)) return Value::from_int(i);
    double d = 0;
    if (parse_py_float(v.str(), d) && std::isfinite(d) && std::fabs(d) < 9.2e18) {
      return Value::from_int(static_cast<int64_t>(d));
    }
  }
  return fallback;
}

Value f_format(Interpreter& interp, const Value& v, CallArgs& args) {
  if (!args.args.empty() && !args.kwargs.empty()) {
    fail(ErrorKind::kType, "can't handle positional and keyword arguments at the same time");
  }
  Value params;
  if (!args.kwargs.empty()) {
    Dict d;
    for (const auto& [k, val] : args.kwargs) d.set(k, val);
    params = Value::from_dict(std::move(d));
  } else {
    params = Value::from_list(args.args, ListFlavor::kTuple);
  }
  return str_result(percent_format(interp, soft_str(v), params));
}

Value f_indent(Interpreter& interp, const Value& v, CallArgs& args) {
  ArgBinder b("indent", args, {"width", "first", "blank"});
  std::string indention;
  if (b.has(0) && b.get(0)->is_string()) {
    indention = b.get(0)->str();
  } else {
    const int64_t w = int_arg(b.get(0), 4, "width");
    interp.check_size(static_cast<size_t>(std::max<int64_t>(w, 0)));
    indention.assign(static_cast<size_t>(std::max<int64_t>(w, 0)), ' ');
  }
  const bool first = b.has(1) && b.get(1)->truthy();
  const bool blank = b.has(2) && b.get(2)->truthy();
  const std::string s = soft_str(v) + "\n";
  const auto lines = split_lines(s);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) rv += "\n" + indention;
      rv += lines[i];
      interp.check_size(rv.size());
    }
  } else {
    rv = lines.empty() ? std::string() : lines.front();
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += indention;
      rv += lines[i];
      interp.check_size(rv.size());
    }
  }
  if (first) rv = indention + rv;
  return Value::from_string(std::move(rv), v.is_safe());
}

Value f_lower(Interpreter&, const Value& v, CallArgs&) {
  return str_result(utf8::lower(soft_str(v)));
}

Value f_upper(Interpreter&, const Value& v, CallArgs&) {
  return str_result(utf8::upper(soft_str(v)));
}

Value f_title(Interpreter&, const Value& v, CallArgs&) {
  return str_result(apply_title(soft_str(v)));
}

Value f_replace(Interpreter& interp, const Value& v, CallArgs& args) {
  ArgBinder b("replace", args, {"old", "new", "count"});
  if (!b.has(0) || !b.has(1)) fail(ErrorKind::kType, "replace() missing required arguments 'old' and 'new'");
  CallArgs a;
  a.args = {Value::from_string(soft_str(*b.get(0))), Value::from_string(soft_str(*b.get(1)))};
  if (b.has(2) && !b.get(2)->is_none()) a.args.push_back(*b.get(2));
  return call_method(interp, Value::from_string(soft_str(v)), "replace", a);
}

Value f_round(Interpreter&, const Value& v, CallArgs& args) {
  ArgBinder b("round", args, {"precision", "method"});
  const int64_t precision = int_arg(b.get(0), 0, "precision");
  const std::string method = b.has(1) ? soft_str(*b.get(1)) : "common";
  if (method != "common" && method != "ceil" && method != "floor") {
    fail(ErrorKind::kValue, "method must be common, ceil or floor");
  }
  if (!v.is_number()) {
    if (v.is_undefined()) raise_undefined(v);
    fail(ErrorKind::kType, "type {} doesn't define __round__ method", v.type_name());
  }
  if (method == "common") {
    if (!v.is_float()) {
      if (precision >= 0) return Value::from_int(v.as_int());
      return Value::from_int(static_cast<int64_t>(py_round(static_cast<double>(v.as_int()), precision)));
    }
    return Value::from_float(py_round(v.as_float(), precision));
  }
  const double p = std::pow(10.0, static_cast<double>(precision));
  const double x = v.as_float() * p;
  return Value::from_float((method == "ceil" ? std::ceil(x) : std::floor(x)) / p);
}

Value f_striptags(Interpreter& interp, const Value& v, CallArgs&) {
  std::string s = soft_str(v);
  std::string no_tags;
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, 4, "<!--") == 0) {
      const size_t e = s.find("-->", i + 4);
      if (e != std::string::npos) {
        i = e + 3;
        continue;
      }
    }
    if (s[i] == '<') {
      const size_t e = s.find('>', i + 1);
      if (e != std::string::npos) {
        i = e + 1;
        continue;
      }
    }
    no_tags.push_back(s[i++]);
  }
  // Collapse whitespace like " ".join(text.split()), then unescape the basic entities.
  CallArgs none;
  std::string collapsed;
  const Value words = call_method(interp, Value::from_string(no_tags), "split", none);
  for (const Value& w : words.list()) {
    if (!collapsed.empty()) collapsed.push_back(' ');
    collapsed += w.str();
  }
  static const std::pair<std::string_view, std::string_view> kEntities[] = {
      {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&#34;", "\""}, {"&#39;", "'"}, {"&amp;", "&"}};
  for (const auto& [from, to] : kEntities) {
    for (size_t p = collapsed.find(from); p != std::string::npos; p = collapsed.find(from, p + to.size())) {
      collapsed.replace(p, from.size(), to);
    }
  }
  return str_result(std::move(collapsed));
}

Value f_trim(Interpreter&, const Value& v, CallArgs& args) {
  ArgBinder b("trim", args, {"chars"});
  const std::string s = soft_str(v);
  std::string chars;
  const std::string* chars_ptr = nullptr;
  if (b.has(0) && !b.get(0)->is_none()) {
    chars = soft_str(*b.get(0));
    chars_ptr = &chars;
  }
  return Value::from_string(std::string(utf8::strip(s, true, true, chars_ptr)), v.is_safe());
}

Value f_truncate(Interpreter&, const Value& v, CallArgs& args) {
  ArgBinder b("truncate", args, {"length", "killwords", "end", "leeway"});
  const int64_t length = int_arg(b.get(0), 255, "length");
  const bool killwords = b.has(1) && b.get(1)->truthy();
  const std::string end = b.has(2) ? soft_str(*b.get(2)) : "...";
  const int64_t leeway = int_arg(b.get(3), 5, "leeway");
  const int64_t end_len = static_cast<int64_t>(utf8::length(end));
  if (length < end_len) fail(ErrorKind::kValue, "expected length >= {}, got {}", end_len, length);
  if (leeway < 0) fail(ErrorKind::kValue, "expected leeway >= 0, got {}", leeway);
  const std::string s = soft_str(v);
  if (static_cast<int64_t>(utf8::length(s)) <= length + leeway) return str_result(s);
  std::string head = s.substr(0, utf8::byte_offset(s, static_cast<size_t>(length - end_len)));
  if (!killwords) {
    const size_t sp = head.rfind(' ');
    if (sp != std::string::npos) head = head.substr(0, sp);
  }
  return str_result(head + end);
}

Value f_wordcount(Interpreter&, const Value& v, CallArgs&) {
  const std::string s = soft_str(v);
  int64_t n = 0;
  bool in_word = false;
  for (size_t i = 0; i < s.size();) {
    const bool w = utf8::is_word(utf8::decode(s, i));
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::from_int(n);
}

}  // namespace pd::jinja::filters
