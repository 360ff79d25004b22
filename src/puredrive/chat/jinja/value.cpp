#include "puredrive/chat/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include "puredrive/chat/jinja/error.h"
#include "puredrive/chat/jinja/utf8.h"

namespace pd::jinja {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kSyntax:
      return "syntax error";
    case ErrorKind::kUndefined:
      return "undefined error";
    case ErrorKind::kType:
      return "type error";
    case ErrorKind::kValue:
      return "value error";
    case ErrorKind::kRaised:
      return "raised by template";
    case ErrorKind::kSecurity:
      return "security error";
    case ErrorKind::kLimit:
      return "limit exceeded";
    case ErrorKind::kUnsupported:
      return "unsupported";
  }
  return "error";
}

std::string UndefinedInfo::message() const {
  if (!hint.empty()) return hint;
  if (owner.empty()) {
    std::string out;
    py_repr_string(name, out);
    return out + " is undefined";
  }
  if (by_item) return fmt::format("{} has no element {}", owner, name);
  std::string quoted_owner;
  py_repr_string(owner, quoted_owner);
  std::string quoted_name;
  py_repr_string(name, quoted_name);
  return fmt::format("{} has no attribute {}", quoted_owner, quoted_name);
}

Value Value::from_string(std::string s, bool safe) {
  Value v(Kind::kString);
  v.flag_ = safe ? 1 : 0;
  v.ptr_ = std::make_shared<std::string>(std::move(s));
  return v;
}

void check_depth(uint32_t depth) {
  if (depth > Value::kMaxDepth) {
    fail(ErrorKind::kLimit, "value nested deeper than {} levels", Value::kMaxDepth);
  }
}

uint32_t Value::depth() const {
  switch (kind_) {
    case Kind::kList:
    case Kind::kDict:
      return depth_;
    case Kind::kObject:
      return object()->depth();
    default:
      return 0;
  }
}

Value Value::from_list(List items, ListFlavor flavor) {
  Value v(Kind::kList);
  v.flag_ = static_cast<uint8_t>(flavor);
  uint32_t inner = 0;
  for (const Value& item : items) inner = std::max(inner, item.depth());
  check_depth(inner + 1);
  v.depth_ = inner + 1;
  v.ptr_ = std::make_shared<List>(std::move(items));
  return v;
}

Value Value::from_dict(Dict d) {
  Value v(Kind::kDict);
  uint32_t inner = 0;
  for (const auto& [k, val] : d.items()) inner = std::max({inner, k.depth(), val.depth()});
  check_depth(inner + 1);
  v.depth_ = inner + 1;
  v.ptr_ = std::make_shared<Dict>(std::move(d));
  return v;
}

Value Value::from_object(std::shared_ptr<Object> o) {
  Value v(Kind::kObject);
  v.ptr_ = std::move(o);
  return v;
}

Value Value::undefined(UndefinedInfo info) {
  Value v(Kind::kUndefined);
  v.ptr_ = std::make_shared<UndefinedInfo>(std::move(info));
  return v;
}

Value Value::undefined_name(std::string_view name) {
  UndefinedInfo info;
  info.name = std::string(name);
  return undefined(std::move(info));
}

double Value::as_float() const {
  switch (kind_) {
    case Kind::kFloat:
      return f_;
    case Kind::kInt:
      return static_cast<double>(i_);
    case Kind::kBool:
      return b_ ? 1.0 : 0.0;
    default:
      return 0.0;
  }
}

const std::string& Value::str() const {
  return *static_cast<const std::string*>(ptr_.get());
}
const List& Value::list() const {
  return *static_cast<const List*>(ptr_.get());
}
const Dict& Value::dict() const {
  return *static_cast<const Dict*>(ptr_.get());
}
Object* Value::object() const {
  return static_cast<Object*>(ptr_.get());
}
const UndefinedInfo* Value::undefined_info() const {
  return kind_ == Kind::kUndefined ? static_cast<const UndefinedInfo*>(ptr_.get()) : nullptr;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0.0;
    case Kind::kString:
      return !str().empty();
    case Kind::kList:
      return !list().empty();
    case Kind::kDict:
      return !dict().empty();
    case Kind::kObject:
      return true;
  }
  return false;
}

bool Value::same_as(const Value& other) const {
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
      return ptr_ == other.ptr_;
    case Kind::kNone:
      return true;
    case Kind::kBool:
      return b_ == other.b_;
    case Kind::kInt:
      return i_ == other.i_;
    case Kind::kFloat:
      return false;  // each Python float literal is its own object
    default:
      return ptr_ == other.ptr_;
  }
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return is_safe() ? "Markup" : "str";
    case Kind::kList:
      switch (flavor()) {
        case ListFlavor::kTuple:
          return "tuple";
        case ListFlavor::kDictKeys:
          return "dict_keys";
        case ListFlavor::kDictValues:
          return "dict_values";
        case ListFlavor::kDictItems:
          return "dict_items";
        case ListFlavor::kGroupTuple:
          return "_GroupTuple";
        case ListFlavor::kList:
          break;
      }
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kObject:
      return object()->type_name();
  }
  return "object";
}

std::string Value::object_type_repr() const {
  if (kind_ == Kind::kNone) return "None";
  const std::string name = type_name();
  if (name == "Markup") return "markupsafe.Markup object";
  if (name == "Undefined" || name == "Macro" || name == "LoopContext")
    return "jinja2.runtime." + name + " object";
  if (name == "Namespace") return "jinja2.utils.Namespace object";
  return name + " object";
}

// ---- Dict --------------------------------------------------------------------------------------

const Value* Dict::find(std::string_view key) const {
  if (!index_.empty()) {
    auto it = index_.find(std::string(key));
    return it == index_.end() ? nullptr : &items_[it->second].second;
  }
  for (const auto& [k, v] : items_) {
    if (k.is_string() && k.str() == key) return &v;
  }
  return nullptr;
}

const Value* Dict::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.str()));
  for (const auto& [k, v] : items_) {
    if (py_equal(k, key)) return &v;
  }
  return nullptr;
}

void Dict::set(Value key, Value value) {
  if (key.is_string() && !index_.empty()) {
    auto it = index_.find(key.str());
    if (it != index_.end()) {
      items_[it->second].second = std::move(value);
      return;
    }
    index_.emplace(key.str(), items_.size());
    items_.emplace_back(std::move(key), std::move(value));
    return;
  }
  for (auto& [k, v] : items_) {
    if (py_equal(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items_.emplace_back(std::move(key), std::move(value));
  if (items_.size() > kIndexThreshold && index_.empty()) {
    for (size_t i = 0; i < items_.size(); ++i) {
      if (items_[i].first.is_string()) index_.emplace(items_[i].first.str(), i);
    }
  }
}

Value Object::call(Interpreter& interp, CallArgs& args) {
  (void)interp;
  (void)args;
  fail(ErrorKind::kType, "'{}' object is not callable", type_name());
}

// ---- Python semantics ---------------------------------------------------------------------------

bool py_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return a.str() == b.str();
    case Kind::kList: {
      if (a.is_tuple() != b.is_tuple() || (!a.is_sequence_list() && a.flavor() != b.flavor())) return false;
      const List& x = a.list();
      const List& y = b.list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!py_equal(x[i], y[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      const Dict& x = a.dict();
      const Dict& y = b.dict();
      if (x.size() != y.size()) return false;
      for (const auto& [k, v] : x.items()) {
        const Value* other = y.find(k);
        if (other == nullptr || !py_equal(v, *other)) return false;
      }
      return true;
    }
    case Kind::kObject:
      return a.object() == b.object();
    default:
      return false;
  }
}

int py_compare(const Value& a, const Value& b, const char* op) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = a.as_float();
      const double y = b.as_float();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    const int64_t x = a.as_int();
    const int64_t y = b.as_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.str().compare(b.str());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_sequence_list() && b.is_sequence_list() && a.is_tuple() == b.is_tuple()) {
    const List& x = a.list();
    const List& y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!py_equal(x[i], y[i])) return py_compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  if (a.is_undefined() || b.is_undefined()) {
    const Value& u = a.is_undefined() ? a : b;
    fail(ErrorKind::kUndefined, "{}", u.undefined_info() ? u.undefined_info()->message() : "undefined");
  }
  fail(ErrorKind::kType, "'{}' not supported between instances of '{}' and '{}'", op, a.type_name(),
       b.type_name());
}

std::string py_float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f < 0 ? "-inf" : "inf";
  if (f == 0.0) return std::signbit(f) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: fixed for -4 < exponent+1 <= 16, else scientific.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));
  std::string out;
  if (sci.front() == '-') {
    out.push_back('-');
    sci.remove_prefix(1);
  }
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_pos)) {
    if (c != '.') digits.push_back(c);
  }
  int exponent = 0;
  std::from_chars(sci.data() + e_pos + 1 + (sci[e_pos + 1] == '+' ? 1 : 0), sci.data() + sci.size(),
                  exponent);
  const int decpt = exponent + 1;
  const int n = static_cast<int>(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0.";
      out.append(static_cast<size_t>(-decpt), '0');
      out += digits;
    } else if (decpt >= n) {
      out += digits;
      out.append(static_cast<size_t>(decpt - n), '0');
      out += ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt));
      out.push_back('.');
      out += digits.substr(static_cast<size_t>(decpt));
    }
  } else {
    out.push_back(digits[0]);
    if (n > 1) {
      out.push_back('.');
      out += digits.substr(1);
    }
    out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', exponent < 0 ? -exponent : exponent);
  }
  return out;
}

void py_repr_string(std::string_view s, std::string& out) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  out.push_back(quote);
  for (size_t i = 0; i < s.size();) {
    const char32_t cp = utf8::decode(s, i);
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(cp));
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x20 || cp == 0x7F) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(cp));
    } else if (cp < 0x7F) {
      out.push_back(static_cast<char>(cp));
    } else if (utf8::is_printable(cp)) {
      append_utf8(out, cp);
    } else if (cp <= 0xFF) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(cp));
    } else if (cp <= 0xFFFF) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(cp));
    } else {
      out += fmt::format("\\U{:08x}", static_cast<unsigned>(cp));
    }
  }
  out.push_back(quote);
}

namespace {

void repr_sequence(const Value& v, std::string& out) {
  const List& items = v.list();
  switch (v.flavor()) {
    case ListFlavor::kTuple:
      out.push_back('(');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += ", ";
        py_repr(items[i], out);
      }
      if (items.size() == 1) out.push_back(',');
      out.push_back(')');
      return;
    case ListFlavor::kGroupTuple:
      out += "_GroupTuple(grouper=";
      py_repr(items[0], out);
      out += ", list=";
      py_repr(items[1], out);
      out.push_back(')');
      return;
    case ListFlavor::kDictKeys:
      out += "dict_keys(";
      break;
    case ListFlavor::kDictValues:
      out += "dict_values(";
      break;
    case ListFlavor::kDictItems:
      out += "dict_items(";
      break;
    case ListFlavor::kList:
      break;
  }
  out.push_back('[');
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ", ";
    py_repr(items[i], out);
  }
  out.push_back(']');
  if (v.flavor() != ListFlavor::kList) out.push_back(')');
}

}  // namespace

void py_repr(const Value& v, std::string& out) {
  switch (v.kind()) {
    case Kind::kUndefined:
      out += "Undefined";
      return;
    case Kind::kString:
      if (v.is_safe()) {
        out += "Markup(";
        py_repr_string(v.str(), out);
        out.push_back(')');
      } else {
        py_repr_string(v.str(), out);
      }
      return;
    case Kind::kList:
      repr_sequence(v, out);
      return;
    case Kind::kDict: {
      out.push_back('{');
      bool first = true;
      for (const auto& [k, val] : v.dict().items()) {
        if (!first) out += ", ";
        first = false;
        py_repr(k, out);
        out += ": ";
        py_repr(val, out);
      }
      out.push_back('}');
      return;
    }
    case Kind::kObject:
      out += v.object()->repr();
      return;
    default:
      py_str(v, out);
  }
}

std::string py_repr(const Value& v) {
  std::string out;
  py_repr(v, out);
  return out;
}

void py_str(const Value& v, std::string& out) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return;
    case Kind::kNone:
      out += "None";
      return;
    case Kind::kBool:
      out += v.as_bool() ? "True" : "False";
      return;
    case Kind::kInt: {
      char buf[32];
      auto res = std::to_chars(buf, buf + sizeof(buf), v.as_int());
      out.append(buf, res.ptr);
      return;
    }
    case Kind::kFloat:
      out += py_float_repr(v.as_float());
      return;
    case Kind::kString:
      out += v.str();
      return;
    default:
      py_repr(v, out);
  }
}

std::string py_str(const Value& v) {
  std::string out;
  py_str(v, out);
  return out;
}

}  // namespace pd::jinja
