// jinja2's builtin filters, in two files: filters.cpp (sequences, mappings, attributes, and the table that
// names every filter) and filters_scalar.cpp (strings and numbers, declared here for the table).
#pragma once

#include <string>

#include "puredrive/chat/jinja/interpreter.h"
#include "puredrive/chat/jinja/py_format.h"

namespace pd::jinja::filters {

inline std::string soft_str(const Value& v) {
  return v.is_string() ? v.str() : py_str(v);
}

inline Value str_result(std::string s) {
  return Value::from_string(std::move(s));
}

inline int64_t int_arg(const Value* v, int64_t fallback, const char* what) {
  if (v == nullptr || v->is_none()) return fallback;
  if (!v->is_int() && !v->is_bool())
    fail(ErrorKind::kType, "{} must be an integer, not {}", what, v->type_name());
  return v->as_int();
}

// The filters, as the table in filters.cpp calls them.
Value f_abs(Interpreter& interp, const Value& v, CallArgs& args);
Value f_capitalize(Interpreter& interp, const Value& v, CallArgs& args);
Value f_center(Interpreter& interp, const Value& v, CallArgs& args);
Value f_escape(Interpreter& interp, const Value& v, CallArgs& args);
Value f_forceescape(Interpreter& interp, const Value& v, CallArgs& args);
Value f_filesizeformat(Interpreter& interp, const Value& v, CallArgs& args);
Value f_float(Interpreter& interp, const Value& v, CallArgs& args);
Value f_int(Interpreter& interp, const Value& v, CallArgs& args);
Value f_format(Interpreter& interp, const Value& v, CallArgs& args);
Value f_indent(Interpreter& interp, const Value& v, CallArgs& args);
Value f_lower(Interpreter& interp, const Value& v, CallArgs& args);
Value f_upper(Interpreter& interp, const Value& v, CallArgs& args);
Value f_title(Interpreter& interp, const Value& v, CallArgs& args);
Value f_replace(Interpreter& interp, const Value& v, CallArgs& args);
Value f_round(Interpreter& interp, const Value& v, CallArgs& args);
Value f_striptags(Interpreter& interp, const Value& v, CallArgs& args);
Value f_trim(Interpreter& interp, const Value& v, CallArgs& args);
Value f_truncate(Interpreter& interp, const Value& v, CallArgs& args);
Value f_wordcount(Interpreter& interp, const Value& v, CallArgs& args);

}  // namespace pd::jinja::filters
