// json.dumps as Python's json module writes it (py_format.h): transformers' `tojson` filter and the tool-call
// arguments of chat templates.

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "puredrive/chat/jinja/py_format.h"
#include "puredrive/chat/jinja/utf8.h"

namespace pd::jinja {

namespace {

void json_string(std::string_view s, bool ensure_ascii, std::string& out) {
  out.push_back('"');
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\') {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    if (c >= 0x80) {
      const size_t start = i;
      const char32_t cp = utf8::decode(s, i);
      if (!ensure_ascii) {
        out.append(s.substr(start, i - start));
      } else if (cp < 0x10000) {
        out += fmt::format("\\u{:04x}", static_cast<unsigned>(cp));
      } else {
        const unsigned n = static_cast<unsigned>(cp) - 0x10000;
        out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 | ((n >> 10) & 0x3FF), 0xDC00 | (n & 0x3FF));
      }
      continue;
    }
    ++i;
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c == 0x7F && !ensure_ascii) {
          out.push_back(static_cast<char>(c));
        } else {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        }
    }
  }
  out.push_back('"');
}

std::string json_float(double f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f < 0 ? "-Infinity" : "Infinity";
  return py_float_repr(f);
}

class JsonWriter {
 public:
  explicit JsonWriter(const JsonOptions& o) : o_(o) {}

  void dump(const Value& v, int level, std::string& out) {
    if (level > 500) fail(ErrorKind::kValue, "maximum recursion depth exceeded while encoding a JSON object");
    switch (v.kind()) {
      case Kind::kNone:
        out += "null";
        return;
      case Kind::kBool:
        out += v.as_bool() ? "true" : "false";
        return;
      case Kind::kInt:
        out += std::to_string(v.as_int());
        return;
      case Kind::kFloat:
        out += json_float(v.as_float());
        return;
      case Kind::kString:
        json_string(v.str(), o_.ensure_ascii, out);
        return;
      case Kind::kList:
        if (v.is_sequence_list()) {
          dump_list(v.list(), level, out);
          return;
        }
        break;
      case Kind::kDict:
        dump_dict(v.dict(), level, out);
        return;
      default:
        break;
    }
    fail(ErrorKind::kType, "Object of type {} is not JSON serializable", v.type_name());
  }

 private:
  void newline_indent(int level, std::string& out) const {
    out.push_back('\n');
    for (int i = 0; i < level; ++i) out += o_.indent;
  }

  void dump_list(const List& items, int level, std::string& out) {
    if (items.empty()) {
      out += "[]";
      return;
    }
    out.push_back('[');
    if (o_.has_indent) newline_indent(level + 1, out);
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) {
        out += o_.item_separator;
        if (o_.has_indent) newline_indent(level + 1, out);
      }
      dump(items[i], level + 1, out);
    }
    if (o_.has_indent) newline_indent(level, out);
    out.push_back(']');
  }

  static std::string key_text(const Value& k) {
    switch (k.kind()) {
      case Kind::kString:
        return k.str();
      case Kind::kInt:
        return std::to_string(k.as_int());
      case Kind::kFloat:
        return json_float(k.as_float());
      case Kind::kBool:
        return k.as_bool() ? "true" : "false";
      case Kind::kNone:
        return "null";
      default:
        fail(ErrorKind::kType, "keys must be str, int, float, bool or None, not {}", k.type_name());
    }
  }

  void dump_dict(const Dict& d, int level, std::string& out) {
    if (d.empty()) {
      out += "{}";
      return;
    }
    std::vector<const Dict::Item*> items;
    items.reserve(d.size());
    for (const auto& item : d.items()) items.push_back(&item);
    if (o_.sort_keys) {
      std::stable_sort(items.begin(), items.end(),
                       [](const Dict::Item* a, const Dict::Item* b) { return py_less(a->first, b->first); });
    }
    out.push_back('{');
    if (o_.has_indent) newline_indent(level + 1, out);
    bool first = true;
    for (const Dict::Item* item : items) {
      if (!first) {
        out += o_.item_separator;
        if (o_.has_indent) newline_indent(level + 1, out);
      }
      first = false;
      json_string(key_text(item->first), o_.ensure_ascii, out);
      out += o_.key_separator;
      dump(item->second, level + 1, out);
    }
    if (o_.has_indent) newline_indent(level, out);
    out.push_back('}');
  }

  const JsonOptions& o_;
};

}  // namespace

std::string json_dumps(const Value& value, const JsonOptions& options) {
  std::string out;
  JsonWriter(options).dump(value, 0, out);
  return out;
}

}  // namespace pd::jinja
