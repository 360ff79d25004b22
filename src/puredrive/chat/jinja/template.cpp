#include "puredrive/chat/jinja/template.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "puredrive/chat/jinja/ast.h"
#include "puredrive/chat/jinja/parser.h"

namespace pd::jinja {

namespace {

Status to_status(const TemplateError& e, const std::string& name) {
  const ErrorCode code =
      e.kind() == ErrorKind::kUnsupported ? ErrorCode::kUnsupported : ErrorCode::kInvalidArgument;
  std::string where = name;
  if (e.has_location()) where += fmt::format(":{}:{}", e.line(), e.column());
  if (e.kind() == ErrorKind::kRaised) {
    return Status(code, fmt::format("{}: template raised an exception: {}", where, e.message()));
  }
  return Status(code, fmt::format("{}: {}: {}", where, error_kind_name(e.kind()), e.message()));
}

}  // namespace

Expected<Template> Template::parse(std::string_view source, std::string name) {
  try {
    std::shared_ptr<const ast::Program> program = parse_template(source);
    return Template(std::move(name), std::move(program));
  } catch (const TemplateError& e) {
    return to_status(e, name);
  }
}

Expected<std::string> Template::render(const Dict& context, const RenderOptions& options) const {
  try {
    Interpreter interp(options.limits, options.fixed_now ? options.fixed_now : fixed_date_from_env());
    return interp.render(*program_, context);
  } catch (const TemplateError& e) {
    return to_status(e, name_);
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::kOutOfMemory, "{}: out of memory while rendering", name_);
  }
}

Expected<std::string> Template::render(const nlohmann::ordered_json& context,
                                       const RenderOptions& options) const {
  if (!context.is_object()) {
    return make_error(ErrorCode::kInvalidArgument, "{}: the render context must be a JSON object, got {}",
                      name_, context.type_name());
  }
  PD_ASSIGN_OR_RETURN(const Value v, value_from_json(context));
  return render(v.dict(), options);
}

namespace {

Value json_to_value(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::from_bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::from_int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::from_float(static_cast<double>(u));
      return Value::from_int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::from_float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::from_string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(json_to_value(item));
      return Value::from_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      d.reserve(j.size());
      for (const auto& [k, v] : j.items()) d.set(k, json_to_value(v));
      return Value::from_dict(std::move(d));
    }
    default:
      return Value::none();
  }
}

}  // namespace

Expected<Value> value_from_json(const nlohmann::ordered_json& j) {
  // Conversion recurses once per level; refuse absurd nesting before it does.
  size_t depth = 0;
  std::vector<std::pair<const nlohmann::ordered_json*, size_t>> stack{{&j, 1}};
  while (!stack.empty()) {
    auto [node, level] = stack.back();
    stack.pop_back();
    depth = std::max(depth, level);
    if (depth > Value::kMaxDepth) {
      return make_error(ErrorCode::kInvalidArgument, "JSON input nested deeper than {} levels",
                        Value::kMaxDepth);
    }
    if (node->is_structured()) {
      for (const auto& child : *node) stack.emplace_back(&child, level + 1);
    }
  }
  return json_to_value(j);
}

Expected<std::tm> parse_fixed_date(std::string_view text) {
  int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
  const std::string s(text);
  char tail = 0;
  const int n =
      std::sscanf(s.c_str(), "%4d-%2d-%2d%c%2d:%2d:%2d", &year, &month, &day, &tail, &hour, &minute, &second);
  const bool ok = (n == 3) || ((n == 6 || n == 7) && (tail == 'T' || tail == ' '));
  if (!ok || month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || minute > 59 || second > 60) {
    return make_error(ErrorCode::kInvalidArgument,
                      "fixed date '{}': expected YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS]", text);
  }
  std::tm tm{};
  tm.tm_year = year - 1900;
  tm.tm_mon = month - 1;
  tm.tm_mday = day;
  tm.tm_hour = hour;
  tm.tm_min = minute;
  tm.tm_sec = second;
  // timegm normalises and fills tm_wday / tm_yday without consulting the local time zone.
  std::tm norm = tm;
  const std::time_t t = timegm(&norm);
  std::tm out{};
  gmtime_r(&t, &out);
  out.tm_isdst = 0;
  return out;
}

std::optional<std::tm> fixed_date_from_env() {
  const char* env = std::getenv("PD_FIXED_DATE");
  if (env == nullptr || *env == '\0') return std::nullopt;
  auto tm = parse_fixed_date(env);
  if (!tm.has_value()) return std::nullopt;
  return *tm;
}

}  // namespace pd::jinja
