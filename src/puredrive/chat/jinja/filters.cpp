// jinja2's builtin filters (jinja2/filters.py, 3.1) with transformers' `tojson` override:
// json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "puredrive/chat/jinja/objects.h"
#include "puredrive/chat/jinja/parser.h"
#include "puredrive/chat/jinja/py_format.h"
#include "puredrive/chat/jinja/utf8.h"

namespace pd::jinja {

namespace {

using FilterFn = Value (*)(Interpreter&, const Value&, CallArgs&);

std::string soft_str(const Value& v) {
  return v.is_string() ? v.str() : py_str(v);
}

Value str_result(std::string s) {
  return Value::from_string(std::move(s));
}

int64_t int_arg(const Value* v, int64_t fallback, const char* what) {
  if (v == nullptr || v->is_none()) return fallback;
  if (!v->is_int() && !v->is_bool())
    fail(ErrorKind::kType, "{} must be an integer, not {}", what, v->type_name());
  return v->as_int();
}

// jinja2.filters.ignore_case
Value ignore_case(const Value& v) {
  return v.is_string() ? Value::from_string(utf8::lower(v.str())) : v;
}

// make_attrgetter: None -> identity, else a dotted path looked up with getitem.
Value attr_of(Interpreter& interp, const Value& item, const Value* attribute, bool lower,
              const Value* dflt = nullptr) {
  Value out = item;
  if (attribute != nullptr && !attribute->is_none()) {
    out = get_attribute_path(interp, item, *attribute);
    if (dflt != nullptr && !dflt->is_none() && out.is_undefined()) out = *dflt;
  }
  return lower ? ignore_case(out) : out;
}

// make_multi_attrgetter: the sort key is a list of one value per comma-separated attribute.
Value multi_attr_of(Interpreter& interp, const Value& item, const Value* attribute, bool lower) {
  List key;
  if (attribute != nullptr && attribute->is_string()) {
    std::string_view rest = attribute->str();
    for (;;) {
      const size_t comma = rest.find(',');
      const Value part = Value::from_string(std::string(rest.substr(0, comma)));
      key.push_back(attr_of(interp, item, &part, lower));
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  } else {
    key.push_back(attr_of(interp, item, attribute, lower));
  }
  return Value::from_list(std::move(key));
}

List sorted_by(List items, const std::vector<Value>& keys, bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return reverse ? py_less(keys[b], keys[a]) : py_less(keys[a], keys[b]);
  });
  List out;
  out.reserve(items.size());
  for (size_t i : order) out.push_back(std::move(items[i]));
  return out;
}

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

// ---- the filters ----

Value f_abs(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_float()) return Value::from_float(std::fabs(v.as_float()));
  if (v.is_int() || v.is_bool()) {
    if (v.as_int() == INT64_MIN) fail(ErrorKind::kValue, "integer overflow");
    return Value::from_int(std::llabs(v.as_int()));
  }
  if (v.is_undefined()) raise_undefined(v);
  fail(ErrorKind::kType, "bad operand type for abs(): '{}'", v.type_name());
}

Value f_attr(Interpreter& interp, const Value& v, CallArgs& args) {
  ArgBinder b("attr", args, {"name"});
  if (!b.has(0)) fail(ErrorKind::kType, "attr() missing the attribute name");
  const std::string name = soft_str(*b.get(0));
  if (v.is_dict()) {
    // getattr() only: dict keys are not attributes.
    if (has_method(v, name)) return interp.getattr(v, name);
    UndefinedInfo info;
    info.owner = v.object_type_repr();
    info.name = name;
    return Value::undefined(std::move(info));
  }
  return interp.getattr(v, name);
}

Value f_batch(Interpreter& interp, const Value& v, CallArgs& args) {
  ArgBinder b("batch", args, {"linecount", "fill_with"});
  const int64_t n = int_arg(b.get(0), 0, "linecount");
  if (n <= 0) fail(ErrorKind::kValue, "batch size must be positive");
  List out;
  List tmp;
  for (const Value& item : interp.iterate(v)) {
    if (static_cast<int64_t>(tmp.size()) == n) {
      out.push_back(Value::from_list(std::move(tmp)));
      tmp.clear();
    }
    tmp.push_back(item);
  }
  if (!tmp.empty()) {
    if (b.has(1) && !b.get(1)->is_none()) {
      while (static_cast<int64_t>(tmp.size()) < n) tmp.push_back(*b.get(1));
    }
    out.push_back(Value::from_list(std::move(tmp)));
  }
  return Value::from_list(std::move(out));
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

Value f_length(Interpreter&, const Value& v, CallArgs&) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return Value::from_int(0);
    case Kind::kString:
      return Value::from_int(static_cast<int64_t>(utf8::length(v.str())));
    case Kind::kList:
      return Value::from_int(static_cast<int64_t>(v.list().size()));
    case Kind::kDict:
      return Value::from_int(static_cast<int64_t>(v.dict().size()));
    default:
      if (auto* loop = v.object_as<LoopContext>()) {
        Value n;
        loop->get_attr("length", n);
        return n;
      }
      fail(ErrorKind::kType, "object of type '{}' has no len()", v.type_name());
  }
}

Value f_default(Interpreter&, const Value& v, CallArgs& args) {
  ArgBinder b("default", args, {"default_value", "boolean"});
  const bool boolean = b.has(1) && b.get(1)->truthy();
  if (v.is_undefined() || (boolean && !v.truthy())) return b.value_or(0, Value::from_string(""));
  return v;
}

Value f_dictsort(Interpreter& interp, const Value& v, CallArgs& args) {
  ArgBinder b("dictsort", args, {"case_sensitive", "by", "reverse"});
  const bool case_sensitive = b.has(0) && b.get(0)->truthy();
  const std::string by = b.has(1) ? soft_str(*b.get(1)) : "key";
  if (by != "key" && by != "value")
    fail(ErrorKind::kValue, "You can only sort by either \"key\" or \"value\"");
  if (!v.is_dict()) fail(ErrorKind::kType, "'{}' object has no attribute 'items'", v.type_name());
  (void)interp;
  List items;
  std::vector<Value> keys;
  for (const auto& [k, val] : v.dict().items()) {
    items.push_back(Value::from_list({k, val}, ListFlavor::kTuple));
    const Value& key = by == "key" ? k : val;
    keys.push_back(case_sensitive ? key : ignore_case(key));
  }
  return Value::from_list(sorted_by(std::move(items), keys, b.has(2) && b.get(2)->truthy()));
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

Value f_first(Interpreter& interp, const Value& v, CallArgs&) {
  const List items = interp.iterate(v);
  if (!items.empty()) return items.front();
  UndefinedInfo info;
  info.hint = "No first item, sequence was empty.";
  return Value::undefined(std::move(info));
}

Value f_last(Interpreter& interp, const Value& v, CallArgs&) {
  const List items = interp.iterate(v);
  if (!items.empty()) return items.back();
  UndefinedInfo info;
  info.hint = "No last item, sequence was empty.";
  return Value::undefined(std::move(info));
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

Value f_groupby(Interpreter& interp, const Value& v, CallArgs& args) {
  ArgBinder b("groupby", args, {"attribute", "default", "case_sensitive"});
  const bool case_sensitive = b.has(2) && b.get(2)->truthy();
  List items = interp.iterate(v);
  std::vector<Value> keys;
  for (const Value& item : items) keys.push_back(attr_of(interp, item, b.get(0), !case_sensitive, b.get(1)));
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return py_less(keys[x], keys[y]); });
  List out;
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    List group;
    while (j < order.size() && py_equal(keys[order[j]], keys[order[i]])) group.push_back(items[order[j++]]);
    const Value grouper =
        case_sensitive ? keys[order[i]] : attr_of(interp, group.front(), b.get(0), false, b.get(1));
    out.push_back(Value::from_list({grouper, Value::from_list(std::move(group))}, ListFlavor::kGroupTuple));
    i = j;
  }
  return Value::from_list(std::move(out));
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

Value f_items(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_undefined()) return Value::from_list({});
  if (!v.is_dict()) fail(ErrorKind::kType, "Can only get item pairs from a mapping.");
  List out;
  out.reserve(v.dict().size());
  for (const auto& [k, val] : v.dict().items()) out.push_back(Value::from_list({k, val}, ListFlavor::kTuple));
  return Value::from_list(std::move(out));
}

Value f_join(Interpreter& interp, const Value& v, CallArgs& args) {
  ArgBinder b("join", args, {"d", "attribute"});
  const std::string sep = b.has(0) ? soft_str(*b.get(0)) : "";
  std::string out;
  bool first = true;
  for (const Value& item : interp.iterate(v)) {
    if (!first) out += sep;
    first = false;
    py_str(attr_of(interp, item, b.get(1), false), out);
    interp.check_size(out.size());
  }
  return str_result(std::move(out));
}

Value f_list(Interpreter& interp, const Value& v, CallArgs&) {
  return Value::from_list(interp.iterate(v));
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

Value f_map(Interpreter& interp, const Value& v, CallArgs& args) {
  if (!v.truthy()) return Value::from_list({});
  List out;
  const List items = interp.iterate(v);
  const auto attr_kw = std::find_if(args.kwargs.begin(), args.kwargs.end(),
                                    [](const auto& kw) { return kw.first == "attribute"; });
  if (args.args.empty() && attr_kw != args.kwargs.end()) {
    const Value* dflt = nullptr;
    for (const auto& [k, val] : args.kwargs) {
      if (k == "default") {
        dflt = &val;
      } else if (k != "attribute") {
        fail(ErrorKind::kType, "Unexpected keyword argument '{}'", k);
      }
    }
    for (const Value& item : items) out.push_back(attr_of(interp, item, &attr_kw->second, false, dflt));
    return Value::from_list(std::move(out));
  }
  if (args.args.empty()) fail(ErrorKind::kType, "map requires a filter argument");
  const std::string name = soft_str(args.args.front());
  CallArgs rest;
  rest.args.assign(args.args.begin() + 1, args.args.end());
  rest.kwargs = args.kwargs;
  for (const Value& item : items) {
    CallArgs a = rest;
    out.push_back(interp.apply_filter(name, item, a));
  }
  return Value::from_list(std::move(out));
}

Value min_max(Interpreter& interp, const Value& v, CallArgs& args, bool want_max, const char* name) {
  ArgBinder b(name, args, {"case_sensitive", "attribute"});
  const List items = interp.iterate(v);
  if (items.empty()) {
    UndefinedInfo info;
    info.hint = "No aggregated item, sequence was empty.";
    return Value::undefined(std::move(info));
  }
  const bool lower = !(b.has(0) && b.get(0)->truthy());
  size_t best = 0;
  Value best_key = attr_of(interp, items[0], b.get(1), lower);
  for (size_t i = 1; i < items.size(); ++i) {
    Value key = attr_of(interp, items[i], b.get(1), lower);
    if (want_max ? py_less(best_key, key) : py_less(key, best_key)) {
      best = i;
      best_key = std::move(key);
    }
  }
  return items[best];
}

Value f_max(Interpreter& interp, const Value& v, CallArgs& args) {
  return min_max(interp, v, args, true, "max");
}
Value f_min(Interpreter& interp, const Value& v, CallArgs& args) {
  return min_max(interp, v, args, false, "min");
}

Value f_pprint(Interpreter&, const Value& v, CallArgs&) {
  return str_result(py_repr(v));
}

Value select_reject(Interpreter& interp, const Value& v, CallArgs& args, bool select, bool by_attr) {
  if (!v.truthy()) return Value::from_list({});
  size_t off = 0;
  const Value* attr = nullptr;
  if (by_attr) {
    if (args.args.empty()) fail(ErrorKind::kType, "Missing parameter for attribute name");
    attr = &args.args[0];
    off = 1;
  }
  const bool has_test = args.args.size() > off;
  std::string test;
  CallArgs test_args;
  if (has_test) {
    test = soft_str(args.args[off]);
    test_args.args.assign(args.args.begin() + static_cast<std::ptrdiff_t>(off + 1), args.args.end());
    test_args.kwargs = args.kwargs;
  }
  List out;
  for (const Value& item : interp.iterate(v)) {
    const Value subject = attr ? get_attribute_path(interp, item, *attr) : item;
    bool ok = false;
    if (has_test) {
      CallArgs a = test_args;
      ok = interp.apply_test(test, subject, a);
    } else {
      ok = subject.truthy();
    }
    if (ok == select) out.push_back(item);
  }
  return Value::from_list(std::move(out));
}

Value f_select(Interpreter& i, const Value& v, CallArgs& a) {
  return select_reject(i, v, a, true, false);
}
Value f_reject(Interpreter& i, const Value& v, CallArgs& a) {
  return select_reject(i, v, a, false, false);
}
Value f_selectattr(Interpreter& i, const Value& v, CallArgs& a) {
  return select_reject(i, v, a, true, true);
}
Value f_rejectattr(Interpreter& i, const Value& v, CallArgs& a) {
  return select_reject(i, v, a, false, true);
}

Value f_replace(Interpreter& interp, const Value& v, CallArgs& args) {
  ArgBinder b("replace", args, {"old", "new", "count"});
  if (!b.has(0) || !b.has(1)) fail(ErrorKind::kType, "replace() missing required arguments 'old' and 'new'");
  CallArgs a;
  a.args = {Value::from_string(soft_str(*b.get(0))), Value::from_string(soft_str(*b.get(1)))};
  if (b.has(2) && !b.get(2)->is_none()) a.args.push_back(*b.get(2));
  return call_method(interp, Value::from_string(soft_str(v)), "replace", a);
}

Value f_reverse(Interpreter& interp, const Value& v, CallArgs&) {
  if (v.is_string()) {
    auto cps = utf8::to_code_points(v.str());
    std::reverse(cps.begin(), cps.end());
    return str_result(utf8::from_code_points(cps.data(), cps.data() + cps.size()));
  }
  List items = interp.iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::from_list(std::move(items));
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

Value f_safe(Interpreter&, const Value& v, CallArgs&) {
  return Value::from_string(soft_str(v), true);
}

Value f_slice(Interpreter& interp, const Value& v, CallArgs& args) {
  ArgBinder b("slice", args, {"slices", "fill_with"});
  const int64_t slices = int_arg(b.get(0), 0, "slices");
  if (slices <= 0) fail(ErrorKind::kValue, "slices must be positive");
  const List seq = interp.iterate(v);
  const int64_t length = static_cast<int64_t>(seq.size());
  const int64_t per = length / slices;
  const int64_t extra = length % slices;
  int64_t offset = 0;
  List out;
  for (int64_t n = 0; n < slices; ++n) {
    const int64_t start = offset + n * per;
    if (n < extra) ++offset;
    const int64_t end = offset + (n + 1) * per;
    List tmp(seq.begin() + start, seq.begin() + std::min(end, length));
    if (b.has(1) && !b.get(1)->is_none() && n >= extra) tmp.push_back(*b.get(1));
    out.push_back(Value::from_list(std::move(tmp)));
  }
  return Value::from_list(std::move(out));
}

Value f_sort(Interpreter& interp, const Value& v, CallArgs& args) {
  ArgBinder b("sort", args, {"reverse", "case_sensitive", "attribute"});
  List items = interp.iterate(v);
  const bool lower = !(b.has(1) && b.get(1)->truthy());
  std::vector<Value> keys;
  keys.reserve(items.size());
  for (const Value& item : items) keys.push_back(multi_attr_of(interp, item, b.get(2), lower));
  return Value::from_list(sorted_by(std::move(items), keys, b.has(0) && b.get(0)->truthy()));
}

Value f_string(Interpreter&, const Value& v, CallArgs&) {
  return v.is_string() ? v : str_result(py_str(v));
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

Value f_sum(Interpreter& interp, const Value& v, CallArgs& args) {
  ArgBinder b("sum", args, {"attribute", "start"});
  Value total = b.value_or(1, Value::from_int(0));
  for (const Value& item : interp.iterate(v)) {
    total = py_binary(interp, ast::BinaryOp::kAdd, total, attr_of(interp, item, b.get(0), false));
  }
  return total;
}

Value f_tojson(Interpreter& interp, const Value& v, CallArgs& args) {
  ArgBinder b("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions o;
  o.ensure_ascii = b.has(0) && b.get(0)->truthy();
  if (b.has(1) && !b.get(1)->is_none()) {
    o.has_indent = true;
    const Value& indent = *b.get(1);
    if (indent.is_string()) {
      o.indent = indent.str();
    } else {
      const int64_t n = int_arg(&indent, 0, "indent");
      interp.check_size(static_cast<size_t>(std::max<int64_t>(n, 0)));
      o.indent.assign(static_cast<size_t>(std::max<int64_t>(n, 0)), ' ');
    }
    o.item_separator = ",";
  }
  if (b.has(2) && !b.get(2)->is_none()) {
    const List seps = interp.iterate(*b.get(2));
    if (seps.size() != 2 || !seps[0].is_string() || !seps[1].is_string()) {
      fail(ErrorKind::kValue, "separators must be a pair of strings");
    }
    o.item_separator = seps[0].str();
    o.key_separator = seps[1].str();
  }
  o.sort_keys = b.has(3) && b.get(3)->truthy();
  std::string out = json_dumps(v, o);
  interp.check_size(out.size());
  return str_result(std::move(out));
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

Value f_unique(Interpreter& interp, const Value& v, CallArgs& args) {
  ArgBinder b("unique", args, {"case_sensitive", "attribute"});
  const bool lower = !(b.has(0) && b.get(0)->truthy());
  List out;
  std::vector<Value> seen;
  for (const Value& item : interp.iterate(v)) {
    Value key = attr_of(interp, item, b.get(1), lower);
    if (key.is_unhashable()) {
      fail(ErrorKind::kType, "unhashable type: '{}'", key.type_name());
    }
    bool dup = false;
    for (const Value& s : seen) {
      if (py_equal(s, key)) {
        dup = true;
        break;
      }
    }
    if (!dup) {
      seen.push_back(std::move(key));
      out.push_back(item);
    }
  }
  return Value::from_list(std::move(out));
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

Value f_unsupported(Interpreter&, const Value&, CallArgs&) {
  fail(ErrorKind::kUnsupported, "this filter is not supported by the interpreter");
}

struct FilterEntry {
  std::string_view name;
  FilterFn fn;
};

constexpr FilterEntry kFilterTable[] = {
    {"abs", f_abs},
    {"attr", f_attr},
    {"batch", f_batch},
    {"capitalize", f_capitalize},
    {"center", f_center},
    {"count", f_length},
    {"d", f_default},
    {"default", f_default},
    {"dictsort", f_dictsort},
    {"e", f_escape},
    {"escape", f_escape},
    {"filesizeformat", f_filesizeformat},
    {"first", f_first},
    {"float", f_float},
    {"forceescape", f_forceescape},
    {"format", f_format},
    {"groupby", f_groupby},
    {"indent", f_indent},
    {"int", f_int},
    {"items", f_items},
    {"join", f_join},
    {"last", f_last},
    {"length", f_length},
    {"list", f_list},
    {"lower", f_lower},
    {"map", f_map},
    {"max", f_max},
    {"min", f_min},
    {"pprint", f_pprint},
    {"random", f_unsupported},
    {"reject", f_reject},
    {"rejectattr", f_rejectattr},
    {"replace", f_replace},
    {"reverse", f_reverse},
    {"round", f_round},
    {"safe", f_safe},
    {"select", f_select},
    {"selectattr", f_selectattr},
    {"slice", f_slice},
    {"sort", f_sort},
    {"string", f_string},
    {"striptags", f_striptags},
    {"sum", f_sum},
    {"title", f_title},
    {"tojson", f_tojson},
    {"trim", f_trim},
    {"truncate", f_truncate},
    {"unique", f_unique},
    {"upper", f_upper},
    {"urlencode", f_unsupported},
    {"urlize", f_unsupported},
    {"wordcount", f_wordcount},
    {"wordwrap", f_unsupported},
    {"xmlattr", f_unsupported},
};

}  // namespace

Value Interpreter::apply_filter(std::string_view name, const Value& value, CallArgs& args) {
  for (const auto& entry : kFilterTable) {
    if (entry.name == name) {
      try {
        return entry.fn(*this, value, args);
      } catch (TemplateError& e) {
        if (e.kind() == ErrorKind::kUnsupported &&
            e.message() == "this filter is not supported by the interpreter") {
          throw TemplateError(ErrorKind::kUnsupported, fmt::format("filter '{}' is not supported", name));
        }
        throw;
      }
    }
  }
  fail(ErrorKind::kSyntax, "No filter named '{}'.", name);
}

}  // namespace pd::jinja
