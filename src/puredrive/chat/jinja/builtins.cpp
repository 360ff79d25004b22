// Global functions of transformers' chat-template environment: jinja2's defaults (range, dict,
// namespace, cycler, joiner) plus raise_exception and strftime_now from transformers.
#include <ctime>

#include "puredrive/chat/jinja/objects.h"

namespace pd::jinja {

namespace {

// jinja2.sandbox.MAX_RANGE
constexpr int64_t kMaxRange = 100000;

int64_t range_arg(const Value& v) {
  if (!v.is_int() && !v.is_bool())
    fail(ErrorKind::kType, "'{}' object cannot be interpreted as an integer", v.type_name());
  return v.as_int();
}

Value builtin_range(Interpreter&, CallArgs& args) {
  if (!args.kwargs.empty()) fail(ErrorKind::kType, "range() takes no keyword arguments");
  if (args.args.empty() || args.args.size() > 3) {
    fail(ErrorKind::kType, "range expected at most 3 arguments, got {}", args.args.size());
  }
  int64_t start = 0;
  int64_t stop = 0;
  int64_t step = 1;
  if (args.args.size() == 1) {
    stop = range_arg(args.args[0]);
  } else {
    start = range_arg(args.args[0]);
    stop = range_arg(args.args[1]);
    if (args.args.size() == 3) step = range_arg(args.args[2]);
  }
  if (step == 0) fail(ErrorKind::kValue, "range() arg 3 must not be zero");
  // Length as Python computes it, without overflow.
  const long double span =
      step > 0 ? static_cast<long double>(stop) - start : static_cast<long double>(start) - stop;
  const long double len = span <= 0 ? 0 : (span + (step > 0 ? step : -step) - 1) / (step > 0 ? step : -step);
  if (len > kMaxRange) {
    fail(ErrorKind::kValue, "Range too big. The sandbox blocks ranges larger than MAX_RANGE ({}).",
         kMaxRange);
  }
  List out;
  out.reserve(static_cast<size_t>(len));
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(Value::from_int(i));
  return Value::from_list(std::move(out));
}

void update_dict(Interpreter& interp, Dict& d, const Value& source) {
  if (source.is_dict()) {
    for (const auto& [k, v] : source.dict().items()) d.set(k, v);
    return;
  }
  if (auto* ns = source.object_as<Namespace>()) {
    for (const auto& [k, v] : ns->attrs.items()) d.set(k, v);
    return;
  }
  for (const Value& item : interp.iterate(source)) {
    const List pair = interp.iterate(item);
    if (pair.size() != 2) {
      fail(ErrorKind::kValue, "dictionary update sequence element has length {}; 2 is required", pair.size());
    }
    d.set(pair[0], pair[1]);
  }
}

Dict dict_from_args(Interpreter& interp, CallArgs& args, const char* what) {
  if (args.args.size() > 1)
    fail(ErrorKind::kType, "{} expected at most 1 argument, got {}", what, args.args.size());
  Dict d;
  if (!args.args.empty()) update_dict(interp, d, args.args[0]);
  for (const auto& [k, v] : args.kwargs) d.set(k, v);
  return d;
}

Value builtin_dict(Interpreter& interp, CallArgs& args) {
  return Value::from_dict(dict_from_args(interp, args, "dict"));
}

Value builtin_namespace(Interpreter& interp, CallArgs& args) {
  auto ns = std::make_shared<Namespace>();
  ns->assign(dict_from_args(interp, args, "namespace"));
  interp.track(ns);
  return Value::from_object(std::move(ns));
}

Value builtin_raise_exception(Interpreter&, CallArgs& args) {
  const Value message = args.args.empty() ? (args.kwargs.empty() ? Value::none() : args.kwargs.front().second)
                                          : args.args.front();
  throw TemplateError(ErrorKind::kRaised, py_str(message));
}

Value builtin_strftime_now(Interpreter& interp, CallArgs& args) {
  if (args.args.size() != 1 || !args.args[0].is_string()) {
    fail(ErrorKind::kType, "strftime_now() takes one string argument (the format)");
  }
  // datetime.strftime handles %f, %z and %Z itself (naive datetime: microseconds 0, empty zone).
  std::string format;
  const std::string& in = args.args[0].str();
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '%' && i + 1 < in.size()) {
      const char c = in[i + 1];
      if (c == 'f') {
        format += "000000";
        ++i;
        continue;
      }
      if (c == 'z' || c == 'Z') {
        ++i;
        continue;
      }
      format += in.substr(i, 2);
      ++i;
      continue;
    }
    format.push_back(in[i]);
  }
  std::tm tm = interp.now();
  if (format.empty()) return Value::from_string("");
  std::string out(format.size() * 4 + 64, '\0');
  for (;;) {
    const size_t n = std::strftime(out.data(), out.size(), format.c_str(), &tm);
    if (n > 0 || out.size() > 65536) {
      out.resize(n);
      break;
    }
    out.resize(out.size() * 2);
  }
  return Value::from_string(std::move(out));
}

class Cycler : public Object {
 public:
  explicit Cycler(List items) : items_(std::move(items)) {
    for (const Value& v : items_) depth_ = std::max(depth_, v.depth() + 1);
  }
  uint32_t depth() const override { return depth_; }
  std::string type_name() const override { return "Cycler"; }
  std::string repr() const override { return "<jinja2.utils.Cycler object>"; }
  void clear_references() override { items_ = {Value()}; }
  bool get_attr(std::string_view name, Value& out) const override {
    auto* self = const_cast<Cycler*>(this);
    if (name == "current") {
      out = items_[pos_];
    } else if (name == "next") {
      out = Value::from_object(std::make_shared<NativeFunction>(
          "next", "<bound method Cycler.next>", [self](Interpreter&, CallArgs&) -> Value {
            Value v = self->items_[self->pos_];
            self->pos_ = (self->pos_ + 1) % self->items_.size();
            return v;
          }));
    } else if (name == "reset") {
      out = Value::from_object(std::make_shared<NativeFunction>("reset", "<bound method Cycler.reset>",
                                                                [self](Interpreter&, CallArgs&) -> Value {
                                                                  self->pos_ = 0;
                                                                  return Value::none();
                                                                }));
    } else {
      return false;
    }
    return true;
  }

 private:
  List items_;
  size_t pos_ = 0;
  uint32_t depth_ = 1;
};

Value builtin_cycler(Interpreter& interp, CallArgs& args) {
  if (args.args.empty()) fail(ErrorKind::kType, "at least one item has to be provided");
  auto cycler = std::make_shared<Cycler>(args.args);
  interp.track(cycler);
  return Value::from_object(std::move(cycler));
}

Value builtin_joiner(Interpreter&, CallArgs& args) {
  ArgBinder b("joiner", args, {"sep"});
  const std::string sep = b.has(0) ? py_str(*b.get(0)) : ", ";
  auto used = std::make_shared<bool>(false);
  return Value::from_object(std::make_shared<NativeFunction>("joiner", "<jinja2.utils.Joiner object>",
                                                             [sep, used](Interpreter&, CallArgs&) -> Value {
                                                               if (!*used) {
                                                                 *used = true;
                                                                 return Value::from_string("");
                                                               }
                                                               return Value::from_string(sep);
                                                             }));
}

Value builtin_lipsum(Interpreter&, CallArgs&) {
  fail(ErrorKind::kUnsupported, "lipsum() is not supported");
}

Value make_builtin(const char* name, Value (*fn)(Interpreter&, CallArgs&)) {
  const std::string repr = name == std::string_view("namespace") || name == std::string_view("cycler")
                               ? fmt::format("<class 'jinja2.utils.{}'>",
                                             name == std::string_view("namespace") ? "Namespace" : "Cycler")
                               : fmt::format("<built-in function {}>", name);
  return Value::from_object(std::make_shared<NativeFunction>(name, repr, fn));
}

}  // namespace

bool lookup_builtin(std::string_view name, Value& out) {
  static const std::pair<std::string_view, Value> kBuiltins[] = {
      {"range", make_builtin("range", builtin_range)},
      {"dict", make_builtin("dict", builtin_dict)},
      {"namespace", make_builtin("namespace", builtin_namespace)},
      {"raise_exception", make_builtin("raise_exception", builtin_raise_exception)},
      {"strftime_now", make_builtin("strftime_now", builtin_strftime_now)},
      {"cycler", make_builtin("cycler", builtin_cycler)},
      {"joiner", make_builtin("joiner", builtin_joiner)},
      {"lipsum", make_builtin("lipsum", builtin_lipsum)},
  };
  for (const auto& [n, v] : kBuiltins) {
    if (n == name) {
      out = v;
      return true;
    }
  }
  return false;
}

}  // namespace pd::jinja
