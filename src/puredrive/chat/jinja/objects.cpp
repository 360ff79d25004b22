// Namespace, Macro and LoopContext behaviour (attribute access, calls) and Python-style argument binding.
#include <algorithm>

#include "puredrive/chat/jinja/objects.h"

namespace pd::jinja {

// ---- objects ---------------------------------------------------------------------------------------

std::string Namespace::repr() const {
  // A namespace can contain itself; Python's dict repr prints the re-entered dict as {...}.
  thread_local std::vector<const Namespace*> active;
  if (std::find(active.begin(), active.end(), this) != active.end()) return "<Namespace {...}>";
  active.push_back(this);
  std::string out = "<Namespace {";
  bool first = true;
  try {
    for (const auto& [k, v] : attrs.items()) {
      if (!first) out += ", ";
      first = false;
      py_repr(k, out);
      out += ": ";
      py_repr(v, out);
    }
  } catch (...) {
    active.pop_back();
    throw;
  }
  active.pop_back();
  return out + "}>";
}

bool Namespace::get_attr(std::string_view name, Value& out) const {
  if (const Value* v = attrs.find(name)) {
    out = *v;
    return true;
  }
  return false;
}

std::string Macro::repr() const {
  std::string name;
  py_repr_string(def_->name, name);
  return "<Macro " + name + ">";
}

bool Macro::get_attr(std::string_view name, Value& out) const {
  if (name == "name") {
    out = Value::from_string(def_->name);
  } else if (name == "arguments") {
    List params;
    for (const auto& p : def_->params) params.push_back(Value::from_string(p));
    out = Value::from_list(std::move(params), ListFlavor::kTuple);
  } else if (name == "catch_kwargs") {
    out = Value::from_bool(def_->uses_kwargs);
  } else if (name == "catch_varargs") {
    out = Value::from_bool(def_->uses_varargs);
  } else if (name == "caller") {
    out = Value::from_bool(def_->uses_caller);
  } else {
    return false;
  }
  return true;
}

Value Macro::call(Interpreter& interp, CallArgs& args) {
  Interpreter::CallDepthGuard guard(interp);
  const ast::MacroDef& def = *def_;
  const size_t n = def.params.size();
  std::vector<const Value*> bound(n, nullptr);
  for (size_t i = 0; i < std::min(n, args.args.size()); ++i) bound[i] = &args.args[i];
  std::vector<bool> kw_used(args.kwargs.size(), false);
  bool found_caller = false;
  for (size_t i = args.args.size(); i < n; ++i) {
    for (size_t k = 0; k < args.kwargs.size(); ++k) {
      if (!kw_used[k] && args.kwargs[k].first == def.params[i]) {
        bound[i] = &args.kwargs[k].second;
        kw_used[k] = true;
        break;
      }
    }
    if (def.params[i] == "caller") found_caller = true;
  }
  if (args.args.size() >= n) {
    found_caller = std::find(def.params.begin(), def.params.end(), "caller") != def.params.end();
  }
  ScopePtr closure = closure_.lock();
  if (!closure) fail(ErrorKind::kValue, "macro '{}' called after its render ended", def.name);
  auto scope = std::make_shared<Scope>(std::move(closure));
  if (def.uses_caller && !found_caller) {
    Value caller = Value::none();
    for (size_t k = 0; k < args.kwargs.size(); ++k) {
      if (!kw_used[k] && args.kwargs[k].first == "caller") {
        caller = args.kwargs[k].second;
        kw_used[k] = true;
        break;
      }
    }
    scope->set("caller", caller);
  }
  Dict extra;
  for (size_t k = 0; k < args.kwargs.size(); ++k) {
    if (!kw_used[k]) extra.set(args.kwargs[k].first, args.kwargs[k].second);
  }
  if (def.uses_kwargs) {
    scope->set("kwargs", Value::from_dict(std::move(extra)));
  } else if (!extra.empty()) {
    const std::string& first = extra.items().front().first.str();
    if (first == "caller") {
      fail(ErrorKind::kType,
           "macro '{}' was invoked with two values for the special caller argument. This is most likely a "
           "bug.",
           def.name);
    }
    fail(ErrorKind::kType, "macro '{}' takes no keyword argument '{}'", def.name, first);
  }
  if (def.uses_varargs) {
    List rest;
    for (size_t i = n; i < args.args.size(); ++i) rest.push_back(args.args[i]);
    scope->set("varargs", Value::from_list(std::move(rest), ListFlavor::kTuple));
  } else if (args.args.size() > n) {
    fail(ErrorKind::kType, "macro '{}' takes not more than {} argument(s)", def.name, n);
  }
  const size_t first_default = n - def.defaults.size();
  for (size_t i = 0; i < n; ++i) {
    if (bound[i] != nullptr) {
      scope->set(def.params[i], *bound[i]);
    } else if (i >= first_default) {
      scope->set(def.params[i], interp.eval(*def.defaults[i - first_default], scope));
    } else {
      UndefinedInfo info;
      info.name = def.params[i];
      info.hint = fmt::format("parameter '{}' was not provided", def.params[i]);
      scope->set(def.params[i], Value::undefined(std::move(info)));
    }
  }
  std::string out;
  interp.exec(def.body, scope, out);
  return Value::from_string(std::move(out));
}

std::string LoopContext::repr() const {
  return fmt::format("<LoopContext {}/{}>", index0 + 1, length());
}

bool LoopContext::get_attr(std::string_view name, Value& out) const {
  const size_t n = length();
  const List& items = items_.list();
  if (name == "index0") {
    out = Value::from_int(static_cast<int64_t>(index0));
  } else if (name == "index") {
    out = Value::from_int(static_cast<int64_t>(index0 + 1));
  } else if (name == "revindex") {
    out = Value::from_int(static_cast<int64_t>(n - index0));
  } else if (name == "revindex0") {
    out = Value::from_int(static_cast<int64_t>(n - index0 - 1));
  } else if (name == "first") {
    out = Value::from_bool(index0 == 0);
  } else if (name == "last") {
    out = Value::from_bool(index0 + 1 == n);
  } else if (name == "length") {
    out = Value::from_int(static_cast<int64_t>(n));
  } else if (name == "depth") {
    out = Value::from_int(depth0_ + 1);
  } else if (name == "depth0") {
    out = Value::from_int(depth0_);
  } else if (name == "previtem") {
    if (index0 > 0) {
      out = items[index0 - 1];
    } else {
      UndefinedInfo info;
      info.hint = "there is no previous item";
      info.name = "previtem";
      out = Value::undefined(std::move(info));
    }
  } else if (name == "nextitem") {
    if (index0 + 1 < n) {
      out = items[index0 + 1];
    } else {
      UndefinedInfo info;
      info.hint = "there is no next item";
      info.name = "nextitem";
      out = Value::undefined(std::move(info));
    }
  } else if (name == "cycle") {
    const size_t i = index0;
    out = Value::from_object(std::make_shared<NativeFunction>(
        "cycle", "<bound method LoopContext.cycle>", [i](Interpreter&, CallArgs& args) -> Value {
          if (args.args.empty()) fail(ErrorKind::kType, "no items for cycling given");
          return args.args[i % args.args.size()];
        }));
  } else if (name == "changed") {
    // Weak: a stored loop.changed must not keep loop states (and what they hold) alive.
    std::weak_ptr<std::pair<bool, List>> weak_state = changed_state_;
    out = Value::from_object(std::make_shared<NativeFunction>(
        "changed", "<bound method LoopContext.changed>", [weak_state](Interpreter&, CallArgs& args) -> Value {
          auto state = weak_state.lock();
          if (!state) fail(ErrorKind::kValue, "loop.changed() called after its loop ended");
          const Value now = Value::from_list(args.args);
          if (!state->first || !py_equal(Value::from_list(state->second), now)) {
            state->first = true;
            state->second = args.args;
            return Value::from_bool(true);
          }
          return Value::from_bool(false);
        }));
  } else {
    return false;
  }
  return true;
}

Value LoopContext::call(Interpreter& interp, CallArgs& args) {
  if (!node_->recursive) {
    fail(ErrorKind::kType, "The loop must have the 'recursive' marker to be called recursively.");
  }
  if (args.args.size() != 1 || !args.kwargs.empty())
    fail(ErrorKind::kType, "loop() takes exactly one argument");
  Interpreter::CallDepthGuard guard(interp);
  std::string out;
  ScopePtr scope = scope_.lock();
  if (!scope) fail(ErrorKind::kValue, "loop() called after its render ended");
  interp.run_loop(*node_, scope, args.args[0], depth0_ + 1, out);
  return Value::from_string(std::move(out));
}

// ---- argument binding ----------------------------------------------------------------------------

ArgBinder::ArgBinder(std::string_view function, CallArgs& args,
                     std::initializer_list<std::string_view> params, bool extra_kwargs_ok)
    : bound_(params.size(), nullptr) {
  if (args.args.size() > params.size()) {
    fail(ErrorKind::kType, "{}() takes at most {} argument(s) ({} given)", function, params.size(),
         args.args.size());
  }
  for (size_t i = 0; i < args.args.size(); ++i) bound_[i] = &args.args[i];
  for (const auto& [name, value] : args.kwargs) {
    auto it = std::find(params.begin(), params.end(), name);
    if (it == params.end()) {
      if (extra_kwargs_ok) continue;
      fail(ErrorKind::kType, "{}() got an unexpected keyword argument '{}'", function, name);
    }
    const size_t idx = static_cast<size_t>(it - params.begin());
    if (bound_[idx] != nullptr)
      fail(ErrorKind::kType, "{}() got multiple values for argument '{}'", function, name);
    bound_[idx] = &value;
  }
}

}  // namespace pd::jinja
