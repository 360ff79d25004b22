#include "puredrive/chat/jinja/py_format.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "puredrive/chat/jinja/utf8.h"

namespace pd::jinja {

// ---- shared number formatting ----------------------------------------------------------------------

namespace {

struct Spec {
  char fill = ' ';
  std::string fill_text = " ";
  char align = 0;  // < > ^ =
  char sign = '-';
  bool alternate = false;
  bool zero = false;
  int width = -1;
  char grouping = 0;
  int precision = -1;
  char type = 0;
};

// Widths and precisions above this fail with kLimit instead of building a string that large: Python would try
// (up to its own overflow error), but no chat template needs a field of a million characters, and a request
// must not make the server allocate gigabytes.
constexpr int64_t kMaxFieldSize = int64_t{1} << 20;

int field_size(int64_t n, const char* what) {
  if (n > kMaxFieldSize || n < -kMaxFieldSize) {
    fail(ErrorKind::kLimit, "format {} {} is beyond the limit of {}", what, n, kMaxFieldSize);
  }
  return static_cast<int>(n);
}

// The decimal digits at s[i...] as a width or precision, i moved past them.
int read_field_size(std::string_view s, size_t& i, const char* what) {
  int64_t n = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
    n = n * 10 + (s[i++] - '0');
    field_size(n, what);  // before n can overflow
  }
  return static_cast<int>(n);
}

std::string pad(std::string body, const Spec& spec, char default_align) {
  const size_t len = utf8::length(body);
  if (spec.width < 0 || len >= static_cast<size_t>(spec.width)) return body;
  const size_t n = static_cast<size_t>(spec.width) - len;
  const char align = spec.align ? spec.align : default_align;
  auto fill = [&](size_t k) {
    std::string f;
    for (size_t i = 0; i < k; ++i) f += spec.fill_text;
    return f;
  };
  if (align == '<') return body + fill(n);
  if (align == '^') return fill(n / 2) + body + fill(n - n / 2);
  if (align == '=') {
    // Padding goes after the sign.
    size_t sign_len = (!body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) ? 1 : 0;
    if (body.size() > sign_len + 1 && body[sign_len] == '0' &&
        (body[sign_len + 1] == 'x' || body[sign_len + 1] == 'X' || body[sign_len + 1] == 'o' ||
         body[sign_len + 1] == 'b')) {
      sign_len += 2;
    }
    return body.substr(0, sign_len) + fill(n) + body.substr(sign_len);
  }
  return fill(n) + body;
}

std::string group_digits(const std::string& digits, char sep) {
  std::string out;
  const size_t n = digits.size();
  for (size_t i = 0; i < n; ++i) {
    if (i > 0 && (n - i) % 3 == 0) out.push_back(sep);
    out.push_back(digits[i]);
  }
  return out;
}

std::string format_int(int64_t v, const Spec& spec) {
  const bool neg = v < 0;
  const uint64_t mag = neg ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  std::string digits;
  std::string prefix;
  switch (spec.type) {
    case 'x':
      digits = fmt::format("{:x}", mag);
      prefix = "0x";
      break;
    case 'X':
      digits = fmt::format("{:X}", mag);
      prefix = "0X";
      break;
    case 'o':
      digits = fmt::format("{:o}", mag);
      prefix = "0o";
      break;
    case 'b':
      digits = fmt::format("{:b}", mag);
      prefix = "0b";
      break;
    case 'c': {
      std::string out;
      append_utf8(out, static_cast<char32_t>(v));
      return pad(out, spec, '<');
    }
    default:
      digits = std::to_string(mag);
      if (spec.grouping) digits = group_digits(digits, spec.grouping);
  }
  std::string sign = neg ? "-" : (spec.sign == '+' ? "+" : (spec.sign == ' ' ? " " : ""));
  std::string body = sign + (spec.alternate ? prefix : "") + digits;
  if (spec.zero && !spec.align && spec.width > 0) {
    Spec z = spec;
    z.fill_text = "0";
    z.align = '=';
    return pad(body, z, '>');
  }
  return pad(body, spec, '>');
}

std::string format_float(double v, const Spec& spec) {
  std::string body;
  char type = spec.type;
  int precision = spec.precision;
  if (std::isnan(v) || std::isinf(v)) {
    const bool upper = type == 'E' || type == 'F' || type == 'G';
    body = std::isnan(v) ? (upper ? "NAN" : "nan") : (upper ? "INF" : "inf");
    if (std::isinf(v) && v < 0) body = "-" + body;
  } else if (type == 0 && precision < 0) {
    body = py_float_repr(v);
  } else {
    std::string suffix;
    if (type == '%') {
      v *= 100;
      type = 'f';
      suffix = "%";
    }
    if (precision < 0) precision = 6;
    std::string c_fmt = "%";
    if (spec.alternate) c_fmt += "#";
    c_fmt += ".*";
    if (type == 0) {
      // No type with a precision: 'g'-like, but keeps at least one fractional digit.
      c_fmt += "g";
    } else {
      c_fmt.push_back(type == 'n' ? 'g' : type);
    }
    char buf[512];
    std::snprintf(buf, sizeof(buf), c_fmt.c_str(), precision == 0 && type == 0 ? 1 : precision, v);
    body = buf;
    if (type == 0 && body.find_first_of(".eEn") == std::string::npos) body += ".0";
    body += suffix;
    if (spec.grouping) {
      const size_t start = body[0] == '-' ? 1 : 0;
      size_t end = start;
      while (end < body.size() && std::isdigit(static_cast<unsigned char>(body[end]))) ++end;
      body = body.substr(0, start) + group_digits(body.substr(start, end - start), spec.grouping) +
             body.substr(end);
    }
  }
  if (body[0] != '-') {
    if (spec.sign == '+') body = "+" + body;
    if (spec.sign == ' ') body = " " + body;
  }
  if (spec.zero && !spec.align && spec.width > 0) {
    Spec z = spec;
    z.fill_text = "0";
    z.align = '=';
    return pad(body, z, '>');
  }
  return pad(body, spec, '>');
}

Spec parse_spec(std::string_view s) {
  Spec spec;
  size_t i = 0;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  // [[fill]align]
  if (!s.empty()) {
    size_t j = 0;
    utf8::decode(s, j);
    if (j < s.size() && is_align(s[j])) {
      spec.fill_text = std::string(s.substr(0, j));
      spec.align = s[j];
      i = j + 1;
    } else if (is_align(s[0])) {
      spec.align = s[0];
      i = 1;
    }
  }
  if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) spec.sign = s[i++];
  if (i < s.size() && s[i] == 'z') ++i;
  if (i < s.size() && s[i] == '#') {
    spec.alternate = true;
    ++i;
  }
  if (i < s.size() && s[i] == '0') {
    spec.zero = true;
    ++i;
  }
  if (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])))
    spec.width = read_field_size(s, i, "width");
  if (i < s.size() && (s[i] == ',' || s[i] == '_')) spec.grouping = s[i++];
  if (i < s.size() && s[i] == '.') {
    ++i;
    spec.precision = 0;
    if (i >= s.size() || !std::isdigit(static_cast<unsigned char>(s[i])))
      fail(ErrorKind::kValue, "Format specifier missing precision");
    spec.precision = read_field_size(s, i, "precision");
  }
  if (i < s.size()) spec.type = s[i++];
  if (i != s.size()) fail(ErrorKind::kValue, "Invalid format specifier '{}'", s);
  return spec;
}

}  // namespace

std::string format_value(const Value& value, std::string_view spec_text) {
  if (spec_text.empty()) return py_str(value);
  const Spec spec = parse_spec(spec_text);
  switch (value.kind()) {
    case Kind::kString: {
      if (spec.type != 0 && spec.type != 's') {
        fail(ErrorKind::kValue, "Unknown format code '{}' for object of type 'str'", spec.type);
      }
      std::string body = value.str();
      if (spec.precision >= 0)
        body = body.substr(0, utf8::byte_offset(body, static_cast<size_t>(spec.precision)));
      return pad(body, spec, '<');
    }
    case Kind::kBool:
    case Kind::kInt:
      if (spec.type == 0 || std::string_view("bcdoxXn").find(spec.type) != std::string_view::npos) {
        if (spec.precision >= 0) fail(ErrorKind::kValue, "Precision not allowed in integer format specifier");
        return format_int(value.as_int(), spec);
      }
      if (std::string_view("eEfFgG%").find(spec.type) != std::string_view::npos)
        return format_float(value.as_float(), spec);
      fail(ErrorKind::kValue, "Unknown format code '{}' for object of type 'int'", spec.type);
    case Kind::kFloat:
      if (spec.type == 0 || std::string_view("eEfFgGn%").find(spec.type) != std::string_view::npos) {
        return format_float(value.as_float(), spec);
      }
      fail(ErrorKind::kValue, "Unknown format code '{}' for object of type 'float'", spec.type);
    default:
      fail(ErrorKind::kType, "unsupported format string passed to {}.__format__", value.type_name());
  }
}

// ---- printf-style -------------------------------------------------------------------------------

std::string percent_format(Interpreter& interp, std::string_view f, const Value& args) {
  std::vector<Value> positional;
  const Dict* mapping = nullptr;
  if (args.is_tuple()) {
    positional = args.list();
  } else {
    positional.push_back(args);
    if (args.is_dict()) mapping = &args.dict();
  }
  size_t next_arg = 0;
  bool used_mapping = false;
  auto take = [&]() -> Value {
    if (next_arg >= positional.size()) fail(ErrorKind::kType, "not enough arguments for format string");
    return positional[next_arg++];
  };
  std::string out;
  for (size_t i = 0; i < f.size();) {
    if (f[i] != '%') {
      out.push_back(f[i++]);
      continue;
    }
    ++i;
    if (i >= f.size()) fail(ErrorKind::kValue, "incomplete format");
    Value arg;
    bool have_arg = false;
    if (f[i] == '(') {
      const size_t close = f.find(')', i);
      if (close == std::string_view::npos) fail(ErrorKind::kValue, "incomplete format key");
      if (mapping == nullptr) fail(ErrorKind::kType, "format requires a mapping");
      const Value* v = mapping->find(f.substr(i + 1, close - i - 1));
      if (v == nullptr) fail(ErrorKind::kValue, "KeyError: '{}'", f.substr(i + 1, close - i - 1));
      arg = *v;
      have_arg = true;
      used_mapping = true;
      i = close + 1;
    }
    Spec spec;
    spec.align = '>';
    for (; i < f.size(); ++i) {
      const char c = f[i];
      if (c == '-') {
        spec.align = '<';
      } else if (c == '+') {
        spec.sign = '+';
      } else if (c == ' ') {
        if (spec.sign != '+') spec.sign = ' ';
      } else if (c == '#') {
        spec.alternate = true;
      } else if (c == '0') {
        spec.zero = true;
      } else {
        break;
      }
    }
    if (i < f.size() && f[i] == '*') {
      // A negative width from the arguments left-aligns, as the '-' flag does.
      const int w = field_size(take().as_int(), "width");
      if (w < 0) spec.align = '<';
      spec.width = w < 0 ? -w : w;
      ++i;
    } else if (i < f.size() && std::isdigit(static_cast<unsigned char>(f[i]))) {
      spec.width = read_field_size(f, i, "width");
    }
    if (i < f.size() && f[i] == '.') {
      ++i;
      spec.precision = 0;
      if (i < f.size() && f[i] == '*') {
        spec.precision = std::max(field_size(take().as_int(), "precision"), 0);  // negative: 0, as in Python
        ++i;
      } else {
        spec.precision = read_field_size(f, i, "precision");
      }
    }
    while (i < f.size() && (f[i] == 'h' || f[i] == 'l' || f[i] == 'L')) ++i;
    if (i >= f.size()) fail(ErrorKind::kValue, "incomplete format");
    const char type = f[i++];
    if (type == '%') {
      out.push_back('%');
      continue;
    }
    if (!have_arg) arg = take();
    if (spec.zero && spec.align == '>') {
      spec.align = 0;
    } else {
      spec.zero = false;
    }
    switch (type) {
      case 's':
      case 'r':
      case 'a': {
        std::string s = type == 's' ? py_str(arg) : py_repr(arg);
        if (spec.precision >= 0) s = s.substr(0, utf8::byte_offset(s, static_cast<size_t>(spec.precision)));
        spec.zero = false;
        out += pad(s, spec, '>');
        break;
      }
      case 'd':
      case 'i':
      case 'u':
        if (!arg.is_number())
          fail(ErrorKind::kType, "%{} format: a real number is required, not {}", type, arg.type_name());
        spec.type = 'd';
        out += format_int(arg.is_float() ? static_cast<int64_t>(arg.as_float()) : arg.as_int(), spec);
        break;
      case 'x':
      case 'X':
      case 'o':
        if (!arg.is_int() && !arg.is_bool()) {
          fail(ErrorKind::kType, "%{} format: an integer is required, not {}", type, arg.type_name());
        }
        spec.type = type;
        out += format_int(arg.as_int(), spec);
        break;
      case 'e':
      case 'E':
      case 'f':
      case 'F':
      case 'g':
      case 'G':
        if (!arg.is_number()) fail(ErrorKind::kType, "must be real number, not {}", arg.type_name());
        spec.type = type;
        if (spec.precision < 0) spec.precision = 6;
        out += format_float(arg.as_float(), spec);
        break;
      case 'c':
        if (arg.is_string()) {
          out += pad(arg.str(), spec, '>');
        } else {
          spec.type = 'c';
          out += format_int(arg.as_int(), spec);
        }
        break;
      default:
        fail(ErrorKind::kValue, "unsupported format character '{}' (0x{:x}) at index {}", type,
             static_cast<unsigned>(static_cast<unsigned char>(type)), i - 1);
    }
    interp.check_size(out.size());
  }
  if (!used_mapping && mapping == nullptr && next_arg < positional.size()) {
    fail(ErrorKind::kType, "not all arguments converted during string formatting");
  }
  return out;
}

// ---- str.format ---------------------------------------------------------------------------------

std::string str_format(Interpreter& interp, std::string_view f, CallArgs& args) {
  std::string out;
  int auto_index = 0;
  for (size_t i = 0; i < f.size();) {
    const char c = f[i];
    if (c == '}') {
      if (i + 1 < f.size() && f[i + 1] == '}') {
        out.push_back('}');
        i += 2;
        continue;
      }
      fail(ErrorKind::kValue, "Single '}}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      ++i;
      continue;
    }
    if (i + 1 < f.size() && f[i + 1] == '{') {
      out.push_back('{');
      i += 2;
      continue;
    }
    // Find the matching close brace (format specs may nest one level of {}).
    size_t j = i + 1;
    int depth = 1;
    while (j < f.size() && depth > 0) {
      if (f[j] == '{') ++depth;
      if (f[j] == '}') --depth;
      if (depth > 0) ++j;
    }
    if (j >= f.size()) fail(ErrorKind::kValue, "expected '}}' before end of string");
    std::string_view field = f.substr(i + 1, j - i - 1);
    i = j + 1;
    std::string_view spec;
    char conversion = 0;
    const size_t colon = field.find(':');
    if (colon != std::string_view::npos) {
      spec = field.substr(colon + 1);
      field = field.substr(0, colon);
    }
    const size_t bang = field.find('!');
    if (bang != std::string_view::npos) {
      if (bang + 2 != field.size()) fail(ErrorKind::kValue, "expected ':' after conversion specifier");
      conversion = field[bang + 1];
      field = field.substr(0, bang);
    }
    size_t name_end = field.find_first_of(".[");
    const std::string_view arg_name = field.substr(0, name_end);
    Value v;
    if (arg_name.empty() || std::all_of(arg_name.begin(), arg_name.end(), [](char ch) {
          return std::isdigit(static_cast<unsigned char>(ch));
        })) {
      const int idx = arg_name.empty() ? auto_index++ : std::stoi(std::string(arg_name));
      if (idx >= static_cast<int>(args.args.size())) {
        fail(ErrorKind::kValue, "Replacement index {} out of range for positional args tuple", idx);
      }
      v = args.args[static_cast<size_t>(idx)];
    } else {
      bool found = false;
      for (const auto& [k, kv] : args.kwargs) {
        if (k == arg_name) {
          v = kv;
          found = true;
        }
      }
      if (!found) fail(ErrorKind::kValue, "KeyError: '{}'", arg_name);
    }
    while (name_end != std::string_view::npos && name_end < field.size()) {
      if (field[name_end] == '.') {
        const size_t next = field.find_first_of(".[", name_end + 1);
        v = interp.getattr(
            v, field.substr(name_end + 1,
                            next == std::string_view::npos ? std::string_view::npos : next - name_end - 1));
        name_end = next;
      } else {
        const size_t close = field.find(']', name_end);
        if (close == std::string_view::npos) fail(ErrorKind::kValue, "Missing ']' in format string");
        const std::string_view key = field.substr(name_end + 1, close - name_end - 1);
        const bool numeric = !key.empty() && std::all_of(key.begin(), key.end(), [](char ch) {
          return std::isdigit(static_cast<unsigned char>(ch));
        });
        v = interp.getitem(v, numeric ? Value::from_int(std::stoll(std::string(key)))
                                      : Value::from_string(std::string(key)));
        name_end = close + 1 < field.size() ? close + 1 : std::string_view::npos;
      }
    }
    if (v.is_undefined()) raise_undefined(v);
    if (conversion == 'r' || conversion == 'a') {
      v = Value::from_string(py_repr(v));
    } else if (conversion == 's') {
      v = Value::from_string(py_str(v));
    } else if (conversion != 0) {
      fail(ErrorKind::kValue, "Unknown conversion specifier {}", conversion);
    }
    std::string spec_text(spec);
    if (spec_text.find('{') != std::string::npos) spec_text = str_format(interp, spec_text, args);
    out += format_value(v, spec_text);
    interp.check_size(out.size());
  }
  return out;
}

}  // namespace pd::jinja
