// jinja2's builtin tests (`x is defined`, `x is mapping`, ...), jinja2/tests.py 3.1.
#include "puredrive/chat/jinja/objects.h"
#include "puredrive/chat/jinja/parser.h"
#include "puredrive/chat/jinja/utf8.h"

namespace pd::jinja {

namespace {

const Value& one_arg(CallArgs& args, std::string_view test) {
  if (args.args.size() + args.kwargs.size() != 1) {
    fail(ErrorKind::kType, "test '{}' takes exactly one argument ({} given)", test,
         args.args.size() + args.kwargs.size());
  }
  return args.args.empty() ? args.kwargs.front().second : args.args.front();
}

void no_args(CallArgs& args, std::string_view test) {
  if (!args.args.empty() || !args.kwargs.empty())
    fail(ErrorKind::kType, "test '{}' takes no arguments", test);
}

bool is_iterable(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kString:
    case Kind::kList:
    case Kind::kDict:
      return true;
    case Kind::kObject:
      return v.object_as<LoopContext>() != nullptr;
    default:
      return false;
  }
}

bool is_sequence(const Value& v) {
  // len(v) and v.__getitem__ both exist.
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kString:
    case Kind::kDict:
      return true;
    case Kind::kList:
      return v.is_sequence_list();
    default:
      return false;
  }
}

bool all_cased(const std::string& s, bool want_lower) {
  bool any = false;
  for (size_t i = 0; i < s.size();) {
    const char32_t cp = utf8::decode(s, i);
    if (want_lower ? utf8::is_upper(cp) : utf8::is_lower(cp)) return false;
    any = any || utf8::is_cased(cp);
  }
  return any;
}

}  // namespace

bool Interpreter::apply_test(std::string_view name, const Value& v, CallArgs& args) {
  if (name == "defined") {
    no_args(args, name);
    return !v.is_undefined();
  }
  if (name == "undefined") {
    no_args(args, name);
    return v.is_undefined();
  }
  if (name == "none") {
    no_args(args, name);
    return v.is_none();
  }
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return is_iterable(v);
  if (name == "sequence") return is_sequence(v);
  if (name == "callable") return v.is_undefined() || (v.is_object() && v.object()->callable());
  if (name == "escaped") return v.is_safe();
  if (name == "lower" || name == "upper") {
    return all_cased(v.is_string() ? v.str() : py_str(v), name == "lower");
  }
  if (name == "odd" || name == "even") {
    const Value m = py_binary(*this, ast::BinaryOp::kMod, v, Value::from_int(2));
    return py_equal(m, Value::from_int(name == "odd" ? 1 : 0));
  }
  if (name == "divisibleby") {
    const Value m = py_binary(*this, ast::BinaryOp::kMod, v, one_arg(args, name));
    return py_equal(m, Value::from_int(0));
  }
  if (name == "sameas") return v.same_as(one_arg(args, name));
  if (name == "in") return contains(one_arg(args, name), v);
  if (name == "eq" || name == "equalto" || name == "==") return py_equal(v, one_arg(args, name));
  if (name == "ne" || name == "!=") return !py_equal(v, one_arg(args, name));
  if (name == "lt" || name == "lessthan" || name == "<") return py_compare(v, one_arg(args, name), "<") < 0;
  if (name == "le" || name == "<=") return py_compare(v, one_arg(args, name), "<=") <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">")
    return py_compare(v, one_arg(args, name), ">") > 0;
  if (name == "ge" || name == ">=") return py_compare(v, one_arg(args, name), ">=") >= 0;
  if (name == "filter") return v.is_string() && is_known_filter(v.str());
  if (name == "test") return v.is_string() && is_known_test(v.str());
  fail(ErrorKind::kSyntax, "No test named '{}'.", name);
}

}  // namespace pd::jinja
