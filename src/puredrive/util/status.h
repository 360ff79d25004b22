// Status and Expected<T>: the error channel for everything that can fail because of the outside world
// (files, configs, weights, requests). Programmer invariants use PD_ASSERT instead.
#pragma once

#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace pd {

enum class ErrorCode {
  kOk = 0,
  kInvalidArgument,  // bad user input: request, flag, template
  kNotFound,         // file or tensor missing
  kCorrupt,          // malformed file contents
  kUnsupported,      // well-formed but not something we implement
  kOutOfMemory,      // plan does not fit
  kIo,               // OS-level failure
  kInternal,
  kCancelled,
};

const char* error_code_name(ErrorCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return {}; }

  bool is_ok() const { return code_ == ErrorCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string to_string() const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

template <typename... Args>
Status make_error(ErrorCode code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}

template <typename T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Expected(Status status) : v_(std::move(status)) {  // NOLINT
    assert(!std::get<Status>(v_).is_ok() && "Expected constructed from an OK status");
  }

  bool has_value() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return has_value(); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Status& status() const { return std::get<Status>(v_); }

 private:
  std::variant<T, Status> v_;
};

[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace pd

#define PD_CONCAT_INNER(a, b) a##b
#define PD_CONCAT(a, b) PD_CONCAT_INNER(a, b)

// Propagate a failed Status.
#define PD_TRY(expr)                                    \
  do {                                                  \
    ::pd::Status pd_try_status_ = (expr);               \
    if (!pd_try_status_.is_ok()) return pd_try_status_; \
  } while (0)

// Assign the value of an Expected or propagate its Status: PD_ASSIGN_OR_RETURN(auto x, f());
#define PD_ASSIGN_OR_RETURN(lhs, expr) PD_ASSIGN_OR_RETURN_IMPL(PD_CONCAT(pd_expected_, __LINE__), lhs, expr)
#define PD_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.has_value()) return tmp.status();     \
  lhs = std::move(tmp).value()

// Programmer invariants (never bad input). Always on.
#define PD_ASSERT(cond, ...)                                                                  \
  do {                                                                                        \
    if (!(cond)) ::pd::assert_fail(#cond, __FILE__, __LINE__, ::fmt::format("" __VA_ARGS__)); \
  } while (0)

#ifdef NDEBUG
#define PD_DCHECK(cond, ...) \
  do {                       \
  } while (0)
#else
#define PD_DCHECK(cond, ...) PD_ASSERT(cond, __VA_ARGS__)
#endif
