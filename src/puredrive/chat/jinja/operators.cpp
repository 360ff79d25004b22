// Python binary arithmetic on template values (+ - * / // % **), including str/list repetition and
// concatenation, printf-style `str % args`, and markupsafe's escaping when a Markup meets a str.
#include <cmath>

#include "puredrive/chat/jinja/interpreter.h"
#include "puredrive/chat/jinja/py_format.h"

namespace pd::jinja {

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '\'':
        out += "&#39;";
        break;
      case '"':
        out += "&#34;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

namespace {

const char* op_symbol(ast::BinaryOp op) {
  switch (op) {
    case ast::BinaryOp::kAdd:
      return "+";
    case ast::BinaryOp::kSub:
      return "-";
    case ast::BinaryOp::kMul:
      return "*";
    case ast::BinaryOp::kDiv:
      return "/";
    case ast::BinaryOp::kFloorDiv:
      return "//";
    case ast::BinaryOp::kMod:
      return "%";
    case ast::BinaryOp::kPow:
      return "** or pow()";
  }
  return "?";
}

[[noreturn]] void unsupported(ast::BinaryOp op, const Value& a, const Value& b) {
  fail(ErrorKind::kType, "unsupported operand type(s) for {}: '{}' and '{}'", op_symbol(op), a.type_name(),
       b.type_name());
}

void check_overflow(bool overflow) {
  if (overflow) fail(ErrorKind::kValue, "integer overflow (Python would use a big integer here)");
}

Value repeat(Interpreter& interp, const Value& seq, int64_t n) {
  const ListFlavor flavor = seq.is_tuple() ? ListFlavor::kTuple : ListFlavor::kList;
  if (n <= 0) return seq.is_string() ? Value::from_string("") : Value::from_list({}, flavor);
  if (seq.is_string()) {
    interp.check_size(seq.str().size() * static_cast<size_t>(n));
    std::string out;
    out.reserve(seq.str().size() * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value::from_string(std::move(out), seq.is_safe());
  }
  interp.check_size(seq.list().size() * static_cast<size_t>(n));
  List out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
  return Value::from_list(std::move(out), flavor);
}

Value int_pow(int64_t base, int64_t exp) {
  if (exp < 0) {
    if (base == 0) fail(ErrorKind::kValue, "0.0 cannot be raised to a negative power");
    return Value::from_float(std::pow(static_cast<double>(base), static_cast<double>(exp)));
  }
  int64_t result = 1;
  int64_t b = base;
  while (exp > 0) {
    if (exp & 1) check_overflow(__builtin_mul_overflow(result, b, &result));
    exp >>= 1;
    if (exp > 0) check_overflow(__builtin_mul_overflow(b, b, &b));
  }
  return Value::from_int(result);
}

}  // namespace

Value py_binary(Interpreter& interp, ast::BinaryOp op, const Value& a, const Value& b) {
  if (a.is_undefined()) raise_undefined(a);
  if (b.is_undefined()) raise_undefined(b);
  const bool ints = (a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool());
  const bool nums = a.is_number() && b.is_number();
  switch (op) {
    case ast::BinaryOp::kAdd:
      if (ints) {
        int64_t r = 0;
        check_overflow(__builtin_add_overflow(a.as_int(), b.as_int(), &r));
        return Value::from_int(r);
      }
      if (nums) return Value::from_float(a.as_float() + b.as_float());
      if (a.is_string() && b.is_string()) {
        interp.check_size(a.str().size() + b.str().size());
        if (a.is_safe() != b.is_safe()) {
          // markupsafe: Markup + str (and str + Markup) escapes the plain side, result is Markup.
          return Value::from_string(
              a.is_safe() ? a.str() + html_escape(b.str()) : html_escape(a.str()) + b.str(), true);
        }
        return Value::from_string(a.str() + b.str(), a.is_safe());
      }
      if (a.is_sequence_list() && b.is_sequence_list() && a.is_tuple() == b.is_tuple()) {
        interp.check_size(a.list().size() + b.list().size());
        List out = a.list();
        out.insert(out.end(), b.list().begin(), b.list().end());
        return Value::from_list(std::move(out), a.is_tuple() ? ListFlavor::kTuple : ListFlavor::kList);
      }
      if (a.is_string())
        fail(ErrorKind::kType, "can only concatenate str (not \"{}\") to str", b.type_name());
      if (a.is_list() && a.flavor() == ListFlavor::kList) {
        fail(ErrorKind::kType, "can only concatenate list (not \"{}\") to list", b.type_name());
      }
      if (a.is_tuple()) {
        fail(ErrorKind::kType, "can only concatenate tuple (not \"{}\") to tuple", b.type_name());
      }
      unsupported(op, a, b);
    case ast::BinaryOp::kSub:
      if (ints) {
        int64_t r = 0;
        check_overflow(__builtin_sub_overflow(a.as_int(), b.as_int(), &r));
        return Value::from_int(r);
      }
      if (nums) return Value::from_float(a.as_float() - b.as_float());
      unsupported(op, a, b);
    case ast::BinaryOp::kMul:
      if (ints) {
        int64_t r = 0;
        check_overflow(__builtin_mul_overflow(a.as_int(), b.as_int(), &r));
        return Value::from_int(r);
      }
      if (nums) return Value::from_float(a.as_float() * b.as_float());
      if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return repeat(interp, a, b.as_int());
      if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return repeat(interp, b, a.as_int());
      if (a.is_string() || b.is_string()) {
        fail(ErrorKind::kType, "can't multiply sequence by non-int of type '{}'",
             (a.is_string() ? b : a).type_name());
      }
      unsupported(op, a, b);
    case ast::BinaryOp::kDiv:
      if (nums) {
        if (b.as_float() == 0.0) fail(ErrorKind::kValue, "division by zero");
        return Value::from_float(a.as_float() / b.as_float());
      }
      unsupported(op, a, b);
    case ast::BinaryOp::kFloorDiv:
      if (ints) {
        const int64_t x = a.as_int();
        const int64_t y = b.as_int();
        if (y == 0) fail(ErrorKind::kValue, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) fail(ErrorKind::kValue, "integer overflow");
        int64_t q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
        return Value::from_int(q);
      }
      if (nums) {
        if (b.as_float() == 0.0) fail(ErrorKind::kValue, "float floor division by zero");
        const double x = a.as_float();
        const double y = b.as_float();
        const double m = std::fmod(x, y);
        double div = (x - m) / y;
        if (m != 0.0 && ((y < 0) != (m < 0))) div -= 1.0;
        double floordiv = std::floor(div);
        if (div - floordiv > 0.5) floordiv += 1.0;
        if (div == 0.0) floordiv = std::copysign(0.0, x / y);
        return Value::from_float(floordiv);
      }
      unsupported(op, a, b);
    case ast::BinaryOp::kMod:
      if (a.is_string()) return Value::from_string(percent_format(interp, a.str(), b));
      if (ints) {
        const int64_t x = a.as_int();
        const int64_t y = b.as_int();
        if (y == 0) fail(ErrorKind::kValue, "integer division or modulo by zero");
        if (y == -1) return Value::from_int(0);
        int64_t m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return Value::from_int(m);
      }
      if (nums) {
        const double x = a.as_float();
        const double y = b.as_float();
        if (y == 0.0) fail(ErrorKind::kValue, "float modulo");
        double m = std::fmod(x, y);
        if (m != 0.0) {
          if ((y < 0) != (m < 0)) m += y;
        } else {
          m = std::copysign(0.0, y);
        }
        return Value::from_float(m);
      }
      unsupported(op, a, b);
    case ast::BinaryOp::kPow:
      if (ints) return int_pow(a.as_int(), b.as_int());
      if (nums) {
        if (a.as_float() == 0.0 && b.as_float() < 0)
          fail(ErrorKind::kValue, "0.0 cannot be raised to a negative power");
        return Value::from_float(std::pow(a.as_float(), b.as_float()));
      }
      unsupported(op, a, b);
  }
  unsupported(op, a, b);
}

}  // namespace pd::jinja
