// Non-data objects templates can hold (internal to pd_jinja): namespace(), macros, loop contexts,
// builtin functions and bound methods. Their Python reprs and type names match jinja2's objects.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "puredrive/chat/jinja/ast.h"
#include "puredrive/chat/jinja/interpreter.h"
#include "puredrive/chat/jinja/value.h"

namespace pd::jinja {

// jinja2.utils.Namespace: the only mutable object (`{% set ns.x = ... %}`).
class Namespace : public Object {
 public:
  Dict attrs;  // write through set() to keep depth() current
  void set(std::string_view name, Value value) {
    const uint32_t d = value.depth() + 1;
    check_depth(d);
    depth_ = std::max(depth_, d);
    attrs.set(name, std::move(value));
  }
  void assign(Dict all) {
    for (const auto& [k, v] : all.items()) {
      check_depth(v.depth() + 1);
      depth_ = std::max(depth_, v.depth() + 1);
    }
    attrs = std::move(all);
  }
  uint32_t depth() const override { return depth_; }
  std::string type_name() const override { return "Namespace"; }
  void clear_references() override { attrs = Dict(); }
  std::string repr() const override;
  bool get_attr(std::string_view name, Value& out) const override;

 private:
  uint32_t depth_ = 1;
};

class Macro : public Object {
 public:
  Macro(const ast::MacroDef* def, std::weak_ptr<Scope> closure) : def_(def), closure_(std::move(closure)) {}
  std::string type_name() const override { return "Macro"; }
  std::string repr() const override;
  bool callable() const override { return true; }
  bool get_attr(std::string_view name, Value& out) const override;
  Value call(Interpreter& interp, CallArgs& args) override;

 private:
  const ast::MacroDef* def_;
  std::weak_ptr<Scope> closure_;  // kept alive by Interpreter::retain
};

// A native callable: builtins (range, dict, ...) and bound methods (loop.cycle, 'x'.upper).
class NativeFunction : public Object {
 public:
  using Fn = std::function<Value(Interpreter&, CallArgs&)>;
  // `depth`: of the values the function holds (a bound method holds its object), plus one.
  NativeFunction(std::string name, std::string repr, Fn fn, uint32_t depth = 1)
      : name_(std::move(name)), repr_(std::move(repr)), fn_(std::move(fn)), depth_(depth) {
    check_depth(depth_);
  }
  uint32_t depth() const override { return depth_; }
  std::string type_name() const override { return "builtin_function_or_method"; }
  std::string repr() const override { return repr_; }
  bool callable() const override { return true; }
  Value call(Interpreter& interp, CallArgs& args) override { return fn_(interp, args); }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::string repr_;
  Fn fn_;
  uint32_t depth_;
};

class LoopContext : public Object {
 public:
  LoopContext(Value items, int depth0, const ast::For* node, std::weak_ptr<Scope> scope)
      : items_(std::move(items)), depth0_(depth0), node_(node), scope_(std::move(scope)) {}
  std::string type_name() const override { return "LoopContext"; }
  std::string repr() const override;
  bool callable() const override { return true; }
  bool get_attr(std::string_view name, Value& out) const override;
  Value call(Interpreter& interp, CallArgs& args) override;  // recursive loops: loop(children)
  void clear_references() override { changed_state_->second.clear(); }
  uint32_t depth() const override { return items_.depth() + 1; }

  size_t index0 = 0;

 private:
  size_t length() const { return items_.list().size(); }
  Value items_;  // a list Value
  int depth0_;
  const ast::For* node_;
  std::weak_ptr<Scope> scope_;  // recursive loops only; kept alive by Interpreter::retain
  // loop.changed() remembers the last value across calls.
  std::shared_ptr<std::pair<bool, List>> changed_state_ = std::make_shared<std::pair<bool, List>>();
};

}  // namespace pd::jinja
