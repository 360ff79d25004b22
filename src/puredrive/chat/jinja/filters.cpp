// jinja2's builtin filters (jinja2/filters.py, 3.1) with transformers' `tojson` override:
// json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "puredrive/chat/jinja/filters.h"
#include "puredrive/chat/jinja/objects.h"
#include "puredrive/chat/jinja/parser.h"
#include "puredrive/chat/jinja/py_format.h"
#include "puredrive/chat/jinja/utf8.h"

namespace pd::jinja {

namespace {

using namespace filters;
using FilterFn = Value (*)(Interpreter&, const Value&, CallArgs&);

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

// ---- the filters ----

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
