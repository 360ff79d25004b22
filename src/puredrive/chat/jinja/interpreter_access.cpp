// Item and attribute access of the interpreter (interpreter.h): subscripts and slices, getattr/getitem
// with jinja2's undefined results and its sandbox rules, iteration and `in`.

#include <memory>
#include <string>
#include <utility>

#include "puredrive/chat/jinja/interpreter.h"
#include "puredrive/chat/jinja/objects.h"
#include "puredrive/chat/jinja/utf8.h"

namespace pd::jinja {

namespace {

// Python slice.indices(): clamps start/stop for a sequence of `len` items.
struct SliceRange {
  int64_t start, stop, step;
};

SliceRange slice_indices(const Value* start_v, const Value* stop_v, const Value* step_v, int64_t len) {
  auto as_index = [](const Value* v, int64_t& out) -> bool {
    if (v == nullptr || v->is_none()) return false;
    if (!v->is_int() && !v->is_bool()) {
      throw TemplateError(ErrorKind::kType,
                          "slice indices must be integers or None or have an __index__ method");
    }
    out = v->as_int();
    return true;
  };
  SliceRange r{0, 0, 1};
  int64_t step = 1;
  if (as_index(step_v, step) && step == 0) fail(ErrorKind::kValue, "slice step cannot be zero");
  r.step = step;
  const int64_t lower = step < 0 ? -1 : 0;
  const int64_t upper = step < 0 ? len - 1 : len;
  auto clamp = [&](int64_t v) {
    if (v < 0) {
      v += len;
      if (v < lower) v = lower;
    } else if (v > upper) {
      v = upper;
    }
    return v;
  };
  int64_t v = 0;
  r.start = as_index(start_v, v) ? clamp(v) : (step < 0 ? upper : lower);
  r.stop = as_index(stop_v, v) ? clamp(v) : (step < 0 ? lower : upper);
  return r;
}

}  // namespace

Value Interpreter::eval_getitem(const ast::Getitem& node, const ScopePtr& scope) {
  const Value obj = eval(*node.obj, scope);
  if (node.index->kind != ast::ExprKind::kSlice) return getitem(obj, eval(*node.index, scope));
  const auto& sl = static_cast<const ast::Slice&>(*node.index);
  const Value start = sl.start ? eval(*sl.start, scope) : Value::none();
  const Value stop = sl.stop ? eval(*sl.stop, scope) : Value::none();
  const Value step = sl.step ? eval(*sl.step, scope) : Value::none();
  if (obj.is_undefined()) raise_undefined(obj);
  const bool is_seq = obj.is_string() || obj.is_sequence_list();
  if (!is_seq) {
    UndefinedInfo info;
    info.owner = obj.object_type_repr();
    info.by_item = true;
    info.name = fmt::format("slice({}, {}, {})", py_repr(start), py_repr(stop), py_repr(step));
    return Value::undefined(std::move(info));
  }
  SliceRange r{};
  try {
    if (obj.is_string() && !utf8::is_ascii(obj.str())) {
      const auto cps = utf8::to_code_points(obj.str());
      r = slice_indices(&start, &stop, &step, static_cast<int64_t>(cps.size()));
      std::string out;
      for (int64_t i = r.start; r.step > 0 ? i < r.stop : i > r.stop; i += r.step) {
        append_utf8(out, cps[static_cast<size_t>(i)]);
      }
      return Value::from_string(std::move(out));
    }
    const int64_t len =
        obj.is_string() ? static_cast<int64_t>(obj.str().size()) : static_cast<int64_t>(obj.list().size());
    r = slice_indices(&start, &stop, &step, len);
  } catch (TemplateError& e) {
    if (e.kind() != ErrorKind::kType) throw;
    // jinja2's getitem turns a TypeError into an undefined value.
    UndefinedInfo info;
    info.owner = obj.object_type_repr();
    info.by_item = true;
    info.name = "slice";
    return Value::undefined(std::move(info));
  }
  if (r.step == 1 && obj.is_string()) {
    return Value::from_string(r.stop > r.start ? obj.str().substr(static_cast<size_t>(r.start),
                                                                  static_cast<size_t>(r.stop - r.start))
                                               : std::string());
  }
  if (obj.is_string()) {
    std::string out;
    for (int64_t i = r.start; r.step > 0 ? i < r.stop : i > r.stop; i += r.step)
      out.push_back(obj.str()[static_cast<size_t>(i)]);
    return Value::from_string(std::move(out));
  }
  List out;
  const List& items = obj.list();
  for (int64_t i = r.start; r.step > 0 ? i < r.stop : i > r.stop; i += r.step)
    out.push_back(items[static_cast<size_t>(i)]);
  return Value::from_list(std::move(out), obj.is_tuple() ? ListFlavor::kTuple : ListFlavor::kList);
}

// ---- Python object protocol (sandboxed) ------------------------------------------------------------

namespace {

Value missing_attribute(const Value& obj, std::string_view name) {
  UndefinedInfo info;
  info.owner = obj.object_type_repr();
  info.name = std::string(name);
  return Value::undefined(std::move(info));
}

Value missing_item(const Value& obj, const Value& key) {
  if (key.is_string()) return missing_attribute(obj, key.str());
  UndefinedInfo info;
  info.owner = obj.object_type_repr();
  info.by_item = true;
  info.name = py_repr(key);
  return Value::undefined(std::move(info));
}

Value unsafe_attribute(const Value& obj, std::string_view name) {
  UndefinedInfo info;
  info.owner = obj.object_type_repr();
  info.name = std::string(name);
  info.hint = fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, obj.type_name());
  info.unsafe = true;
  return Value::undefined(std::move(info));
}

bool is_dunder(std::string_view name) {
  return name.size() > 4 && name.substr(0, 2) == "__" && name.substr(name.size() - 2) == "__";
}

Value bound_method(const Value& obj, std::string_view name) {
  std::string n(name);
  const std::string repr = fmt::format("<built-in method {} of {} object>", n, obj.type_name());
  return Value::from_object(std::make_shared<NativeFunction>(
      n, repr, [obj, n](Interpreter& interp, CallArgs& args) { return call_method(interp, obj, n, args); },
      obj.depth() + 1));
}

}  // namespace

Value Interpreter::getattr(const Value& obj, std::string_view name) {
  switch (obj.kind()) {
    case Kind::kUndefined:
      raise_undefined(obj);
    case Kind::kString:
    case Kind::kList:
    case Kind::kDict:
      if (obj.is_list() && obj.flavor() == ListFlavor::kGroupTuple && (name == "grouper" || name == "list")) {
        return obj.list()[name == "grouper" ? 0 : 1];
      }
      if (has_method(obj, name)) return bound_method(obj, name);
      if (is_unsafe_method(obj, name)) return unsafe_attribute(obj, name);
      if (obj.is_dict()) {
        if (const Value* v = obj.dict().find(name)) return *v;
      }
      if (is_dunder(name)) return unsafe_attribute(obj, name);
      return missing_attribute(obj, name);
    case Kind::kObject: {
      Value out;
      if (obj.object()->get_attr(name, out)) return out;
      return missing_attribute(obj, name);
    }
    default:
      if (is_dunder(name)) return unsafe_attribute(obj, name);
      return missing_attribute(obj, name);
  }
}

Value Interpreter::getitem(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Kind::kUndefined:
      raise_undefined(obj);
    case Kind::kDict: {
      if (key.is_unhashable()) return missing_item(obj, key);
      if (const Value* v = obj.dict().find(key)) return *v;
      break;
    }
    case Kind::kList: {
      if (key.is_int() || key.is_bool()) {
        const List& items = obj.list();
        int64_t i = key.as_int();
        if (i < 0) i += static_cast<int64_t>(items.size());
        if (i >= 0 && i < static_cast<int64_t>(items.size())) return items[static_cast<size_t>(i)];
        return missing_item(obj, key);
      }
      break;
    }
    case Kind::kString: {
      if (key.is_int() || key.is_bool()) {
        const std::string& s = obj.str();
        int64_t i = key.as_int();
        if (utf8::is_ascii(s)) {
          if (i < 0) i += static_cast<int64_t>(s.size());
          if (i >= 0 && i < static_cast<int64_t>(s.size()))
            return Value::from_string(std::string(1, s[static_cast<size_t>(i)]));
        } else {
          const auto cps = utf8::to_code_points(s);
          if (i < 0) i += static_cast<int64_t>(cps.size());
          if (i >= 0 && i < static_cast<int64_t>(cps.size())) {
            std::string out;
            append_utf8(out, cps[static_cast<size_t>(i)]);
            return Value::from_string(std::move(out));
          }
        }
        return missing_item(obj, key);
      }
      break;
    }
    case Kind::kObject: {
      if (key.is_string()) {
        if (auto* ns = obj.object_as<Namespace>()) {
          if (const Value* v = ns->attrs.find(key.str())) return *v;
          return missing_item(obj, key);
        }
      }
      break;
    }
    default:
      break;
  }
  // obj[key] failed: jinja2 retries string keys as attributes.
  if (key.is_string()) return getattr(obj, key.str());
  return missing_item(obj, key);
}

List Interpreter::iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return {};
    case Kind::kList:
      return v.list();
    case Kind::kDict: {
      List keys;
      keys.reserve(v.dict().size());
      for (const auto& [k, val] : v.dict().items()) keys.push_back(k);
      return keys;
    }
    case Kind::kString: {
      List chars;
      const std::string& s = v.str();
      chars.reserve(s.size());
      for (size_t i = 0; i < s.size();) {
        const size_t start = i;
        utf8::decode(s, i);
        chars.push_back(Value::from_string(s.substr(start, i - start)));
      }
      return chars;
    }
    default:
      fail(ErrorKind::kType, "'{}' object is not iterable", v.type_name());
  }
}

bool Interpreter::contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::kUndefined:
      return false;
    case Kind::kString:
      if (!item.is_string()) {
        fail(ErrorKind::kType, "'in <string>' requires string as left operand, not {}", item.type_name());
      }
      return container.str().find(item.str()) != std::string::npos;
    case Kind::kList:
      for (const Value& v : container.list()) {
        if (py_equal(v, item)) return true;
      }
      return false;
    case Kind::kDict:
      if (item.is_unhashable()) {
        fail(ErrorKind::kType, "unhashable type: '{}'", item.type_name());
      }
      return container.dict().find(item) != nullptr;
    default:
      fail(ErrorKind::kType, "argument of type '{}' is not iterable", container.type_name());
  }
}

Value get_attribute_path(Interpreter& interp, const Value& item, const Value& attribute) {
  if (!attribute.is_string()) return interp.getitem(item, attribute);
  Value cur = item;
  std::string_view path = attribute.str();
  for (;;) {
    const size_t dot = path.find('.');
    const std::string_view part = path.substr(0, dot);
    bool all_digits = !part.empty();
    for (char c : part) all_digits = all_digits && c >= '0' && c <= '9';
    if (all_digits) {
      cur = interp.getitem(cur, Value::from_int(std::stoll(std::string(part))));
    } else {
      cur = interp.getitem(cur, Value::from_string(std::string(part)));
    }
    if (dot == std::string_view::npos) return cur;
    path.remove_prefix(dot + 1);
  }
}

}  // namespace pd::jinja
