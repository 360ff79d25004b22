// Errors raised while parsing or rendering a template. The interpreter uses this exception internally
// (deeply nested evaluation with many failure points); Template::parse/render turn it into a pd::Status
// at the API boundary, so no exception ever leaves the library.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace pd::jinja {

enum class ErrorKind {
  kSyntax,       // TemplateSyntaxError / TemplateAssertionError
  kUndefined,    // UndefinedError
  kType,         // TypeError
  kValue,        // ValueError, KeyError, IndexError, ZeroDivisionError, OverflowError
  kRaised,       // the template called raise_exception(message)
  kSecurity,     // sandbox refusal (mutating a list, private attributes)
  kLimit,        // our own limits: recursion depth, loop iterations, output size
  kUnsupported,  // valid Jinja2 that this interpreter does not implement (include, extends, ...)
};

const char* error_kind_name(ErrorKind kind);

class TemplateError : public std::runtime_error {
 public:
  TemplateError(ErrorKind kind, std::string message, int line = 0, int column = 0)
      : std::runtime_error(message),
        kind_(kind),
        message_(std::move(message)),
        line_(line),
        column_(column) {}
  ErrorKind kind() const { return kind_; }
  const std::string& message() const { return message_; }
  int line() const { return line_; }
  int column() const { return column_; }
  bool has_location() const { return line_ > 0; }
  void set_location(int line, int column) {
    line_ = line;
    column_ = column;
  }

 private:
  ErrorKind kind_;
  std::string message_;
  int line_;
  int column_;
};

template <typename... Args>
[[noreturn]] void fail(ErrorKind kind, fmt::format_string<Args...> f, Args&&... args) {
  throw TemplateError(kind, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace pd::jinja
