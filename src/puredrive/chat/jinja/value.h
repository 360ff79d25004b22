// The value model of the template interpreter: the subset of Python objects that Jinja2 templates see
// (None, bool, int, float, str, list/tuple, insertion-ordered dict, namespace, macro, callables) plus
// Jinja2's Undefined. Semantics (truthiness, ==, <, printing) follow Python, because the reference is
// transformers' jinja2 environment and rendered prompts must match it byte for byte.
//
// Values are cheap to copy: containers and strings are shared, immutable once built (templates cannot
// mutate lists or dicts in the immutable sandbox); only Namespace objects are mutable.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace pd::jinja {

class Value;
class Object;
class Dict;
using List = std::vector<Value>;

enum class Kind : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kObject };

// Which Python type a list stands for; only printing and a few type tests depend on it.
// kGroupTuple: the (grouper, list) namedtuple of the groupby filter.
enum class ListFlavor : uint8_t { kList, kTuple, kDictKeys, kDictValues, kDictItems, kGroupTuple };

// Why a value is undefined, to produce Jinja2's messages when it is used:
//   'x' is undefined / 'dict object' has no attribute 'x' / list object has no element 3 / <hint>.
struct UndefinedInfo {
  std::string name;      // variable or attribute name, or the repr of a missing key
  std::string owner;     // type description of the container ("dict object"); empty: a free name
  bool by_item = false;  // missing element with a non-string key
  std::string hint;      // replaces the generated message when set
  bool unsafe = false;   // sandbox refused the attribute: using it raises a SecurityError
  std::string message() const;
};

class Value {
 public:
  Value() = default;  // undefined
  static Value none() { return Value(Kind::kNone); }
  static Value from_bool(bool b) {
    Value v(Kind::kBool);
    v.b_ = b;
    return v;
  }
  static Value from_int(int64_t i) {
    Value v(Kind::kInt);
    v.i_ = i;
    return v;
  }
  static Value from_float(double f) {
    Value v(Kind::kFloat);
    v.f_ = f;
    return v;
  }
  static Value from_string(std::string s, bool safe = false);
  static Value from_list(List items, ListFlavor flavor = ListFlavor::kList);
  static Value from_dict(Dict d);
  static Value from_object(std::shared_ptr<Object> o);
  static Value undefined(UndefinedInfo info);
  static Value undefined_name(std::string_view name);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_object() const { return kind_ == Kind::kObject; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::kBool ? static_cast<int64_t>(b_) : i_; }
  double as_float() const;  // int, bool or float
  const std::string& str() const;
  bool is_safe() const { return kind_ == Kind::kString && flag_ != 0; }  // jinja2 Markup
  const List& list() const;
  ListFlavor flavor() const { return static_cast<ListFlavor>(flag_); }
  bool is_tuple() const {
    return kind_ == Kind::kList && (flavor() == ListFlavor::kTuple || flavor() == ListFlavor::kGroupTuple);
  }
  // list or tuple (not a dict view): indexable, sliceable, JSON-serializable
  bool is_sequence_list() const {
    return kind_ == Kind::kList && (flavor() == ListFlavor::kList || is_tuple());
  }
  // Python raises "unhashable type" for these as dict keys or set members.
  bool is_unhashable() const { return kind_ == Kind::kDict || (kind_ == Kind::kList && !is_tuple()); }
  const Dict& dict() const;
  Object* object() const;
  template <typename T>
  T* object_as() const {
    return kind_ == Kind::kObject ? dynamic_cast<T*>(object()) : nullptr;
  }
  const UndefinedInfo* undefined_info() const;
  // Nesting depth of containers (0 for scalars). Construction fails beyond kMaxDepth, which bounds every
  // recursion over values (printing, comparing, JSON, destruction) on hostile templates or inputs.
  uint32_t depth() const;
  static constexpr uint32_t kMaxDepth = 256;

  bool truthy() const;
  // Python identity for `is sameas`: equal scalars, or the same container.
  bool same_as(const Value& other) const;
  // Python type name as in error messages: 'str', 'int', 'NoneType', 'dict', 'Undefined', ...
  std::string type_name() const;
  // jinja2.utils.object_type_repr: "dict object", "None", "str object", ...
  std::string object_type_repr() const;

 private:
  explicit Value(Kind k) : kind_(k) {}
  Kind kind_ = Kind::kUndefined;
  uint8_t flag_ = 0;    // string: Markup; list: ListFlavor
  uint32_t depth_ = 0;  // list / dict: nesting depth
  union {
    bool b_;
    int64_t i_ = 0;
    double f_;
  };
  std::shared_ptr<void> ptr_;  // std::string, List, Dict, Object or UndefinedInfo
};

// Insertion-ordered dict with Python key equality (1 == 1.0 == True). Large dicts keep an index of
// their string keys so lookups stay O(1) on big JSON inputs.
class Dict {
 public:
  using Item = std::pair<Value, Value>;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  // Python d[key] = value: replaces in place when present, else appends.
  void set(Value key, Value value);
  void set(std::string_view key, Value value) { set(Value::from_string(std::string(key)), std::move(value)); }
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  const std::vector<Item>& items() const { return items_; }
  void reserve(size_t n) { items_.reserve(n); }

 private:
  static constexpr size_t kIndexThreshold = 16;
  std::vector<Item> items_;
  std::unordered_map<std::string, size_t> index_;  // string keys, once size() > kIndexThreshold
};

class Interpreter;
struct CallArgs;

// Everything that is not plain data: namespace(), macros, builtins, bound methods, loop contexts.
class Object {
 public:
  virtual ~Object() = default;
  virtual std::string type_name() const = 0;  // Python type name
  virtual std::string repr() const = 0;
  virtual bool callable() const { return false; }
  // Attribute access; false when the attribute does not exist.
  virtual bool get_attr(std::string_view name, Value& out) const {
    (void)name;
    (void)out;
    return false;
  }
  virtual Value call(Interpreter& interp, CallArgs& args);
  // Drops references to other values. Called on mutable objects when a render ends, because only they
  // can close a reference cycle (a namespace holding itself) that shared ownership would leak.
  virtual void clear_references() {}
  // Nesting depth of the values the object holds, plus one.
  virtual uint32_t depth() const { return 1; }
};

// Throws the kLimit error for a value nested deeper than Value::kMaxDepth.
void check_depth(uint32_t depth);

// Python semantics shared by the interpreter, filters and tests.
bool py_equal(const Value& a, const Value& b);
// Python ordering: negative, zero or positive; throws TypeError naming `op` on unorderable types.
int py_compare(const Value& a, const Value& b, const char* op);
inline bool py_less(const Value& a, const Value& b) {
  return py_compare(a, b, "<") < 0;
}
// Python str(v) appended to out (Undefined prints nothing).
void py_str(const Value& v, std::string& out);
std::string py_str(const Value& v);
// Python repr(v).
void py_repr(const Value& v, std::string& out);
std::string py_repr(const Value& v);
void py_repr_string(std::string_view s, std::string& out);
std::string py_float_repr(double f);

}  // namespace pd::jinja
