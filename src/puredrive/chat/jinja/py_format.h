// Python text formatting that templates reach: json.dumps (transformers' `tojson` filter),
// printf-style `%` formatting (the `format` filter and str % args), str.format and format specs.
#pragma once

#include <string>
#include <string_view>

#include "puredrive/chat/jinja/interpreter.h"
#include "puredrive/chat/jinja/value.h"

namespace pd::jinja {

struct JsonOptions {
  bool ensure_ascii = false;
  bool has_indent = false;
  std::string indent;  // per level (indent=N gives N spaces)
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};

// json.dumps(value, ...) exactly as Python's json module writes it. Throws TypeError for values
// JSON cannot represent (Undefined, namespaces, macros).
std::string json_dumps(const Value& value, const JsonOptions& options);

// Python `fmt % args` for str.
std::string percent_format(Interpreter& interp, std::string_view fmt, const Value& args);

// Python fmt.format(*args, **kwargs) (jinja2's sandboxed formatter).
std::string str_format(Interpreter& interp, std::string_view fmt, CallArgs& args);

// Python format(value, spec).
std::string format_value(const Value& value, std::string_view spec);

}  // namespace pd::jinja
