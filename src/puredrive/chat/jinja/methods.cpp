// Methods of str, list and dict values, as the immutable sandbox exposes them: everything that does
// not mutate. Mutating methods (list.append, dict.pop, ...) raise the sandbox's SecurityError.
#include <algorithm>
#include <array>

#include "puredrive/chat/jinja/interpreter.h"
#include "puredrive/chat/jinja/py_format.h"
#include "puredrive/chat/jinja/utf8.h"

namespace pd::jinja {

namespace {

constexpr std::array<std::string_view, 44> kStrMethods = {
    "capitalize",   "casefold",   "center",     "count",        "endswith",     "expandtabs", "find",
    "format",       "index",      "isalnum",    "isalpha",      "isascii",      "isdecimal",  "isdigit",
    "islower",      "isnumeric",  "isspace",    "istitle",      "isupper",      "join",       "ljust",
    "lower",        "lstrip",     "partition",  "removeprefix", "removesuffix", "replace",    "rfind",
    "rindex",       "rjust",      "rpartition", "rsplit",       "rstrip",       "split",      "splitlines",
    "startswith",   "strip",      "swapcase",   "title",        "upper",        "zfill",      "format_map",
    "isidentifier", "isprintable"};
constexpr std::array<std::string_view, 3> kListMethods = {"count", "index", "copy"};
constexpr std::array<std::string_view, 5> kDictMethods = {"get", "keys", "values", "items", "copy"};
constexpr std::array<std::string_view, 8> kUnsafeListMethods = {"append", "extend",  "insert", "pop",
                                                                "remove", "reverse", "sort",   "clear"};
constexpr std::array<std::string_view, 5> kUnsafeDictMethods = {"clear", "pop", "popitem", "setdefault",
                                                                "update"};

template <size_t N>
bool in(const std::array<std::string_view, N>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

const std::string& arg_str(const Value& v, std::string_view method) {
  if (!v.is_string()) fail(ErrorKind::kType, "{}() argument must be str, not {}", method, v.type_name());
  return v.str();
}

int64_t arg_int(const Value& v, std::string_view method) {
  if (!v.is_int() && !v.is_bool()) {
    fail(ErrorKind::kType, "'{}' object cannot be interpreted as an integer (in {}())", v.type_name(),
         method);
  }
  return v.as_int();
}

// Python str.split / rsplit.
List split(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right) {
  List out;
  if (sep == nullptr || sep->is_none()) {
    // Runs of whitespace; leading/trailing whitespace ignored.
    const auto cps = utf8::to_code_points(s);
    std::vector<std::pair<size_t, size_t>> words;  // code point ranges
    if (!from_right) {
      size_t i = 0;
      while (i < cps.size()) {
        while (i < cps.size() && utf8::is_space(cps[i])) ++i;
        if (i >= cps.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          words.emplace_back(i, cps.size());  // the remainder keeps its trailing whitespace
          break;
        }
        size_t j = i;
        while (j < cps.size() && !utf8::is_space(cps[j])) ++j;
        words.emplace_back(i, j);
        i = j;
      }
    } else {
      size_t i = cps.size();
      while (i > 0) {
        while (i > 0 && utf8::is_space(cps[i - 1])) --i;
        if (i == 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          words.emplace_back(0, i);  // the remainder keeps its leading whitespace
          break;
        }
        size_t j = i;
        while (j > 0 && !utf8::is_space(cps[j - 1])) --j;
        words.emplace_back(j, i);
        i = j;
      }
      std::reverse(words.begin(), words.end());
    }
    for (auto [b, e] : words)
      out.push_back(Value::from_string(utf8::from_code_points(cps.data() + b, cps.data() + e)));
    return out;
  }
  const std::string& d = arg_str(*sep, from_right ? "rsplit" : "split");
  if (d.empty()) fail(ErrorKind::kValue, "empty separator");
  std::vector<std::string> parts;
  if (!from_right) {
    size_t start = 0;
    for (;;) {
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) break;
      const size_t p = s.find(d, start);
      if (p == std::string::npos) break;
      parts.push_back(s.substr(start, p - start));
      start = p + d.size();
    }
    parts.push_back(s.substr(start));
  } else {
    size_t end = s.size();
    for (;;) {
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) break;
      if (end < d.size()) break;
      const size_t p = s.rfind(d, end - d.size());
      if (p == std::string::npos) break;
      parts.push_back(s.substr(p + d.size(), end - p - d.size()));
      end = p;
    }
    parts.push_back(s.substr(0, end));
    std::reverse(parts.begin(), parts.end());
  }
  for (auto& p : parts) out.push_back(Value::from_string(std::move(p)));
  return out;
}

// Python str.find/index/count take optional start/end in code points.
struct Range {
  size_t begin, end;  // byte offsets
};

Range sub_range(const std::string& s, const CallArgs& args, size_t first_opt) {
  const int64_t len = static_cast<int64_t>(utf8::length(s));
  auto norm = [&](const Value* v, int64_t fallback) {
    if (v == nullptr || v->is_none()) return fallback;
    int64_t i = arg_int(*v, "find");
    if (i < 0) i = std::max<int64_t>(0, i + len);
    return std::min(i, len);
  };
  const int64_t b = norm(args.args.size() > first_opt ? &args.args[first_opt] : nullptr, 0);
  const int64_t e = norm(args.args.size() > first_opt + 1 ? &args.args[first_opt + 1] : nullptr, len);
  return {utf8::byte_offset(s, static_cast<size_t>(b)),
          utf8::byte_offset(s, static_cast<size_t>(std::max(b, e)))};
}

int64_t cp_index(const std::string& s, size_t byte_pos) {
  return static_cast<int64_t>(utf8::length(std::string_view(s).substr(0, byte_pos)));
}

bool matches_affix(const std::string& s, const Value& affix, bool prefix, std::string_view method) {
  auto one = [&](const Value& a) {
    const std::string& x = arg_str(a, method);
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_tuple()) {
    for (const Value& a : affix.list()) {
      if (one(a)) return true;
    }
    return false;
  }
  if (!affix.is_string()) {
    fail(ErrorKind::kType, "{} first arg must be str or a tuple of str, not {}", method, affix.type_name());
  }
  return one(affix);
}

std::string title_case(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (size_t i = 0; i < s.size();) {
    const char32_t cp = utf8::decode(s, i);
    if (utf8::is_cased(cp)) {
      if (prev_cased) {
        utf8::append_lower(out, cp);
      } else {
        utf8::append_title(out, cp);
      }
      prev_cased = true;
    } else {
      append_utf8(out, cp);
      prev_cased = false;
    }
  }
  return out;
}

template <typename Pred>
bool all_chars(const std::string& s, Pred pred) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size();) {
    if (!pred(utf8::decode(s, i))) return false;
  }
  return true;
}

std::string justify(Interpreter& interp, const std::string& s, const CallArgs& args, char how) {
  if (args.args.empty()) fail(ErrorKind::kType, "justify expected at least 1 argument, got 0");
  const int64_t width = arg_int(args.args[0], "justify");
  std::string fill = " ";
  if (args.args.size() > 1) {
    fill = arg_str(args.args[1], "justify");
    if (utf8::length(fill) != 1)
      fail(ErrorKind::kType, "The fill character must be exactly one character long");
  }
  const int64_t len = static_cast<int64_t>(utf8::length(s));
  if (width <= len) return s;
  interp.check_size(static_cast<size_t>(width) * fill.size());
  const int64_t n = width - len;
  auto rep = [&](int64_t k) {
    std::string r;
    for (int64_t i = 0; i < k; ++i) r += fill;
    return r;
  };
  if (how == '<') return s + rep(n);
  if (how == '>') return rep(n) + s;
  // Python's center puts the extra character on the left when the string length is odd... exactly:
  const int64_t left = n / 2 + (n & width & 1);
  return rep(left) + s + rep(n - left);
}

Value str_method(Interpreter& interp, const Value& self, std::string_view name, CallArgs& args) {
  const std::string& s = self.str();
  auto need = [&](size_t lo, size_t hi) {
    if (!args.kwargs.empty() && name != "split" && name != "rsplit" && name != "format" &&
        name != "splitlines" && name != "replace" && name != "expandtabs") {
      fail(ErrorKind::kType, "{}() takes no keyword arguments", name);
    }
    if (args.args.size() < lo || args.args.size() > hi) {
      fail(ErrorKind::kType, "{}() takes {} argument(s) ({} given)", name,
           lo == hi ? std::to_string(lo) : fmt::format("{} to {}", lo, hi), args.args.size());
    }
  };
  auto str_value = [](std::string v) { return Value::from_string(std::move(v)); };
  if (name == "upper") {
    need(0, 0);
    return str_value(utf8::upper(s));
  }
  if (name == "lower" || name == "casefold") {
    need(0, 0);
    return str_value(utf8::lower(s));
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    need(0, 1);
    const std::string* chars = nullptr;
    if (!args.args.empty() && !args.args[0].is_none()) chars = &arg_str(args.args[0], name);
    return str_value(std::string(utf8::strip(s, name != "rstrip", name != "lstrip", chars)));
  }
  if (name == "split" || name == "rsplit") {
    ArgBinder b(name, args, {"sep", "maxsplit"});
    const int64_t maxsplit = b.has(1) ? arg_int(*b.get(1), name) : -1;
    return Value::from_list(split(s, b.get(0), maxsplit, name == "rsplit"));
  }
  if (name == "startswith" || name == "endswith") {
    need(1, 3);
    const Range r = sub_range(s, args, 1);
    const std::string sub = s.substr(r.begin, r.end - r.begin);
    return Value::from_bool(matches_affix(sub, args.args[0], name == "startswith", name));
  }
  if (name == "replace") {
    ArgBinder b(name, args, {"old", "new", "count"});
    if (!b.has(0) || !b.has(1)) fail(ErrorKind::kType, "replace expected at least 2 arguments");
    const std::string& from = arg_str(*b.get(0), name);
    const std::string& to = arg_str(*b.get(1), name);
    int64_t count = b.has(2) ? arg_int(*b.get(2), name) : -1;
    std::string out;
    if (from.empty()) {
      // Python inserts `to` between every character (and at both ends).
      int64_t done = 0;
      for (size_t i = 0; i <= s.size();) {
        if (count < 0 || done < count) {
          out += to;
          ++done;
        }
        if (i == s.size()) break;
        const size_t start = i;
        utf8::decode(s, i);
        out.append(s, start, i - start);
        interp.check_size(out.size());
      }
      return str_value(std::move(out));
    }
    size_t pos = 0;
    for (int64_t done = 0; count < 0 || done < count; ++done) {
      const size_t p = s.find(from, pos);
      if (p == std::string::npos) break;
      out.append(s, pos, p - pos);
      out += to;
      interp.check_size(out.size());
      pos = p + from.size();
    }
    out.append(s, pos, std::string::npos);
    return str_value(std::move(out));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    need(1, 3);
    const std::string& sub = arg_str(args.args[0], name);
    const Range r = sub_range(s, args, 1);
    const std::string_view hay = std::string_view(s).substr(r.begin, r.end - r.begin);
    const size_t p = (name == "find" || name == "index") ? hay.find(sub) : hay.rfind(sub);
    if (p == std::string_view::npos) {
      if (name == "index" || name == "rindex") fail(ErrorKind::kValue, "substring not found");
      return Value::from_int(-1);
    }
    return Value::from_int(cp_index(s, r.begin + p));
  }
  if (name == "count") {
    need(1, 3);
    const std::string& sub = arg_str(args.args[0], name);
    const Range r = sub_range(s, args, 1);
    const std::string_view hay = std::string_view(s).substr(r.begin, r.end - r.begin);
    if (sub.empty()) return Value::from_int(static_cast<int64_t>(utf8::length(hay)) + 1);
    int64_t n = 0;
    for (size_t p = hay.find(sub); p != std::string_view::npos; p = hay.find(sub, p + sub.size())) ++n;
    return Value::from_int(n);
  }
  if (name == "title") {
    need(0, 0);
    return str_value(title_case(s));
  }
  if (name == "capitalize") {
    need(0, 0);
    std::string out;
    size_t i = 0;
    if (!s.empty()) utf8::append_title(out, utf8::decode(s, i));
    while (i < s.size()) utf8::append_lower(out, utf8::decode(s, i));
    return str_value(std::move(out));
  }
  if (name == "swapcase") {
    need(0, 0);
    std::string out;
    for (size_t i = 0; i < s.size();) {
      const char32_t cp = utf8::decode(s, i);
      if (utf8::is_upper(cp)) {
        utf8::append_lower(out, cp);
      } else if (utf8::is_lower(cp)) {
        utf8::append_upper(out, cp);
      } else {
        append_utf8(out, cp);
      }
    }
    return str_value(std::move(out));
  }
  if (name == "join") {
    need(1, 1);
    std::string out;
    bool first = true;
    for (const Value& v : interp.iterate(args.args[0])) {
      if (!v.is_string())
        fail(ErrorKind::kType, "sequence item: expected str instance, {} found", v.type_name());
      if (!first) out += s;
      first = false;
      out += v.str();
      interp.check_size(out.size());
    }
    return str_value(std::move(out));
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    need(1, 2);
    return str_value(justify(interp, s, args, name == "center" ? '^' : name == "ljust" ? '<' : '>'));
  }
  if (name == "zfill") {
    need(1, 1);
    const int64_t width = arg_int(args.args[0], name);
    const int64_t len = static_cast<int64_t>(utf8::length(s));
    if (width <= len) return self;
    interp.check_size(static_cast<size_t>(width));
    const size_t sign = (!s.empty() && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
    return str_value(s.substr(0, sign) + std::string(static_cast<size_t>(width - len), '0') + s.substr(sign));
  }
  if (name == "splitlines") {
    ArgBinder b(name, args, {"keepends"});
    const bool keep = b.has(0) && b.get(0)->truthy();
    List out;
    size_t start = 0;
    for (size_t i = 0; i < s.size();) {
      const size_t at = i;
      const char32_t cp = utf8::decode(s, i);
      const bool is_break = cp == '\n' || cp == '\r' || cp == '\v' || cp == '\f' || cp == 0x1C ||
                            cp == 0x1D || cp == 0x1E || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
      if (!is_break) continue;
      size_t end_of_break = i;
      if (cp == '\r' && i < s.size() && s[i] == '\n') end_of_break = ++i;
      out.push_back(str_value(s.substr(start, (keep ? end_of_break : at) - start)));
      start = end_of_break;
    }
    if (start < s.size()) out.push_back(str_value(s.substr(start)));
    return Value::from_list(std::move(out));
  }
  if (name == "partition" || name == "rpartition") {
    need(1, 1);
    const std::string& sep = arg_str(args.args[0], name);
    if (sep.empty()) fail(ErrorKind::kValue, "empty separator");
    const size_t p = name == "partition" ? s.find(sep) : s.rfind(sep);
    List parts;
    if (p == std::string::npos) {
      if (name == "partition") {
        parts = {self, str_value(""), str_value("")};
      } else {
        parts = {str_value(""), str_value(""), self};
      }
    } else {
      parts = {str_value(s.substr(0, p)), str_value(sep), str_value(s.substr(p + sep.size()))};
    }
    return Value::from_list(std::move(parts), ListFlavor::kTuple);
  }
  if (name == "removeprefix" || name == "removesuffix") {
    need(1, 1);
    const std::string& a = arg_str(args.args[0], name);
    if (name == "removeprefix" && s.compare(0, a.size(), a) == 0) return str_value(s.substr(a.size()));
    if (name == "removesuffix" && !a.empty() && s.size() >= a.size() &&
        s.compare(s.size() - a.size(), a.size(), a) == 0) {
      return str_value(s.substr(0, s.size() - a.size()));
    }
    return self;
  }
  if (name == "expandtabs") {
    ArgBinder b(name, args, {"tabsize"});
    const int64_t tab = b.has(0) ? arg_int(*b.get(0), name) : 8;
    std::string out;
    int64_t col = 0;
    for (size_t i = 0; i < s.size();) {
      const char32_t cp = utf8::decode(s, i);
      if (cp == '\t') {
        if (tab > 0) {
          const int64_t n = tab - col % tab;
          out.append(static_cast<size_t>(n), ' ');
          col += n;
        }
      } else {
        append_utf8(out, cp);
        col = (cp == '\n' || cp == '\r') ? 0 : col + 1;
      }
      interp.check_size(out.size());
    }
    return str_value(std::move(out));
  }
  if (name == "format") return str_value(str_format(interp, s, args));
  if (name == "format_map") {
    need(1, 1);
    CallArgs kw;
    if (args.args[0].is_dict()) {
      for (const auto& [k, v] : args.args[0].dict().items()) kw.kwargs.emplace_back(py_str(k), v);
    }
    return str_value(str_format(interp, s, kw));
  }
  need(0, 0);
  if (name == "isalnum") return Value::from_bool(all_chars(s, utf8::is_alnum));
  if (name == "isalpha") return Value::from_bool(all_chars(s, utf8::is_alpha));
  if (name == "isascii") return Value::from_bool(utf8::is_ascii(s));
  if (name == "isdecimal" || name == "isdigit" || name == "isnumeric")
    return Value::from_bool(all_chars(s, utf8::is_decimal));
  if (name == "isspace") return Value::from_bool(all_chars(s, utf8::is_space));
  if (name == "isprintable") {
    return Value::from_bool(s.empty() || all_chars(s, utf8::is_printable));
  }
  if (name == "isidentifier") {
    if (s.empty() || utf8::is_decimal(static_cast<unsigned char>(s[0]))) return Value::from_bool(false);
    return Value::from_bool(all_chars(s, [](char32_t c) { return utf8::is_word(c); }));
  }
  if (name == "islower" || name == "isupper") {
    bool any_cased = false;
    for (size_t i = 0; i < s.size();) {
      const char32_t cp = utf8::decode(s, i);
      if (name == "islower" ? utf8::is_upper(cp) : utf8::is_lower(cp)) return Value::from_bool(false);
      any_cased = any_cased || utf8::is_cased(cp);
    }
    return Value::from_bool(any_cased);
  }
  if (name == "istitle")
    return Value::from_bool(!s.empty() && title_case(s) == s && all_chars(s, [](char32_t) { return true; }) &&
                            [&] {
                              for (size_t i = 0; i < s.size();) {
                                if (utf8::is_cased(utf8::decode(s, i))) return true;
                              }
                              return false;
                            }());
  fail(ErrorKind::kType, "str.{} is not supported", name);
}

Value list_method(Interpreter& interp, const Value& self, std::string_view name, CallArgs& args) {
  (void)interp;
  const List& items = self.list();
  if (name == "copy") return Value::from_list(items, self.flavor());
  if (args.args.empty()) fail(ErrorKind::kType, "{}() takes at least 1 argument (0 given)", name);
  if (name == "count") {
    int64_t n = 0;
    for (const Value& v : items) n += py_equal(v, args.args[0]) ? 1 : 0;
    return Value::from_int(n);
  }
  for (size_t i = 0; i < items.size(); ++i) {
    if (py_equal(items[i], args.args[0])) return Value::from_int(static_cast<int64_t>(i));
  }
  fail(ErrorKind::kValue, "{} is not in list", py_repr(args.args[0]));
}

Value dict_method(Interpreter& interp, const Value& self, std::string_view name, CallArgs& args) {
  (void)interp;
  const Dict& d = self.dict();
  if (name == "get") {
    if (args.args.empty() || args.args.size() > 2 || !args.kwargs.empty()) {
      fail(ErrorKind::kType, "get expected 1 or 2 arguments, got {}", args.args.size());
    }
    const Value& key = args.args[0];
    if (key.is_unhashable()) {
      fail(ErrorKind::kType, "unhashable type: '{}'", key.type_name());
    }
    if (const Value* v = d.find(key)) return *v;
    return args.args.size() > 1 ? args.args[1] : Value::none();
  }
  if (!args.args.empty() || !args.kwargs.empty()) fail(ErrorKind::kType, "{}() takes no arguments", name);
  if (name == "copy") return self;
  List out;
  out.reserve(d.size());
  for (const auto& [k, v] : d.items()) {
    if (name == "keys") {
      out.push_back(k);
    } else if (name == "values") {
      out.push_back(v);
    } else {
      out.push_back(Value::from_list({k, v}, ListFlavor::kTuple));
    }
  }
  const ListFlavor flavor = name == "keys"     ? ListFlavor::kDictKeys
                            : name == "values" ? ListFlavor::kDictValues
                                               : ListFlavor::kDictItems;
  return Value::from_list(std::move(out), flavor);
}

}  // namespace

bool has_method(const Value& obj, std::string_view name) {
  switch (obj.kind()) {
    case Kind::kString:
      return in(kStrMethods, name);
    case Kind::kList:
      return obj.is_sequence_list() && in(kListMethods, name) && !(obj.is_tuple() && name == "copy");
    case Kind::kDict:
      return in(kDictMethods, name);
    default:
      return false;
  }
}

bool is_unsafe_method(const Value& obj, std::string_view name) {
  if (obj.is_list() && obj.flavor() == ListFlavor::kList) return in(kUnsafeListMethods, name);
  if (obj.is_dict()) return in(kUnsafeDictMethods, name);
  return false;
}

Value call_method(Interpreter& interp, const Value& obj, std::string_view name, CallArgs& args) {
  switch (obj.kind()) {
    case Kind::kString:
      return str_method(interp, obj, name, args);
    case Kind::kList:
      return list_method(interp, obj, name, args);
    case Kind::kDict:
      return dict_method(interp, obj, name, args);
    default:
      fail(ErrorKind::kType, "'{}' object has no method '{}'", obj.type_name(), name);
  }
}

}  // namespace pd::jinja
