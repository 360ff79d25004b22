// Tree-walking evaluator (internal to pd_jinja). Scoping follows jinja2's compiled code: `for`
// bodies get a fresh scope per iteration, macros see their defining scope (looked up at call time),
// `if` shares its scope, `{% set ns.x %}` mutates the namespace object found up the chain.
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "puredrive/chat/jinja/ast.h"
#include "puredrive/chat/jinja/error.h"
#include "puredrive/chat/jinja/value.h"

namespace pd::jinja {

struct RenderLimits {
  size_t max_output_bytes = size_t{64} << 20;  // also the largest string or list an expression may build
  uint64_t max_loop_iterations = 5'000'000;    // summed over all loops of one render
  int max_call_depth = 100;                    // nested macro calls / recursive loops
};

struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
};

class Scope {
 public:
  explicit Scope(std::shared_ptr<Scope> parent) : parent_(std::move(parent)) {}
  const Value* lookup(std::string_view name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent_.get()) {
      for (const auto& [k, v] : s->vars_) {
        if (k == name) return &v;
      }
    }
    return nullptr;
  }
  void set(std::string_view name, Value value) {
    for (auto& [k, v] : vars_) {
      if (k == name) {
        v = std::move(value);
        return;
      }
    }
    vars_.emplace_back(std::string(name), std::move(value));
  }
  void clear() { vars_.clear(); }
  const std::shared_ptr<Scope>& parent() const { return parent_; }

 private:
  std::shared_ptr<Scope> parent_;
  std::vector<std::pair<std::string, Value>> vars_;
};
using ScopePtr = std::shared_ptr<Scope>;

class Interpreter {
 public:
  Interpreter(RenderLimits limits, std::optional<std::tm> fixed_now);
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Renders the program with `context` as the template's global variables.
  std::string render(const ast::Program& program, const Dict& context);

  Value eval(const ast::Expr& expr, const ScopePtr& scope);

  // Python/jinja2 operations shared with filters, tests and methods.
  Value getattr(const Value& obj, std::string_view name);  // sandboxed environment.getattr
  Value getitem(const Value& obj, const Value& key);       // sandboxed environment.getitem
  List iterate(const Value& v);                            // iter(v) materialized
  Value call(const Value& callee, CallArgs& args);
  Value apply_filter(std::string_view name, const Value& value, CallArgs& args);
  bool apply_test(std::string_view name, const Value& value, CallArgs& args);
  bool contains(const Value& container, const Value& item);  // Python `item in container`
  // Fails with kLimit when a string or list of `bytes`/items would exceed the output limit.
  void check_size(size_t size) const;
  void count_iteration();
  std::tm now() const;  // local time, or the fixed time of the render options

  // Closures (macros, recursive loops) refer to their scope without owning it; the interpreter keeps
  // such scopes alive until the render ends, so no scope -> macro -> scope cycle exists.
  std::weak_ptr<Scope> retain(const ScopePtr& scope);
  // Mutable objects created during the render; their references are cleared when it ends.
  void track(const std::shared_ptr<Object>& object) { tracked_.push_back(object); }

  // Macro invocation and recursive loops track their depth here.
  struct CallDepthGuard {
    explicit CallDepthGuard(Interpreter& i);
    ~CallDepthGuard() { --interp.call_depth_; }
    Interpreter& interp;
  };

  enum class Flow { kNormal, kBreak, kContinue };
  Flow exec(const ast::Body& body, const ScopePtr& scope, std::string& out);
  // Runs a for loop over `iterable` (also the entry point of recursive loops, depth0 > 0).
  void run_loop(const ast::For& node, const ScopePtr& scope, const Value& iterable, int depth0,
                std::string& out);

 private:
  Flow exec_stmt(const ast::Stmt& stmt, const ScopePtr& scope, std::string& out);
  void exec_assign(const ast::Expr& target, Value value, const ScopePtr& scope);
  Value eval_inner(const ast::Expr& expr, const ScopePtr& scope);
  Value eval_call(const ast::Call& node, const ScopePtr& scope);
  Value eval_binary(const ast::Binary& node, const ScopePtr& scope);
  Value eval_compare(const ast::Compare& node, const ScopePtr& scope);
  Value eval_getitem(const ast::Getitem& node, const ScopePtr& scope);
  Value lookup_name(const ast::Name& node, const ScopePtr& scope);
  CallArgs eval_args(const ast::CallArgsExpr& args, const ScopePtr& scope);
  Value apply_filter_chain(const ast::Expr& filter, Value input, const ScopePtr& scope);
  void emit(std::string& out, std::string_view text) const;

  RenderLimits limits_;
  std::optional<std::tm> fixed_now_;
  uint64_t iterations_ = 0;
  int call_depth_ = 0;
  std::vector<ScopePtr> retained_;
  std::vector<std::weak_ptr<Object>> tracked_;
};

// The one-line Python-style message for using an undefined value, raised as UndefinedError (or a
// SecurityError for attributes the sandbox refuses).
[[noreturn]] void raise_undefined(const Value& undefined);

// Python binary arithmetic (+ - * / // % **) with jinja2's Markup escaping on +.
Value py_binary(Interpreter& interp, ast::BinaryOp op, const Value& a, const Value& b);

// Methods of str / list / dict values reachable from templates (sandbox: no mutating methods).
bool has_method(const Value& obj, std::string_view name);
bool is_unsafe_method(const Value& obj, std::string_view name);
Value call_method(Interpreter& interp, const Value& obj, std::string_view name, CallArgs& args);

// Global functions: range, dict, namespace, cycler, joiner, raise_exception, strftime_now.
bool lookup_builtin(std::string_view name, Value& out);

// Binds positional and keyword arguments to a Python-style signature for builtins and filters.
class ArgBinder {
 public:
  // `params`: parameter names in order (excluding the filter's input value).
  ArgBinder(std::string_view function, CallArgs& args, std::initializer_list<std::string_view> params,
            bool extra_kwargs_ok = false);
  const Value* get(size_t index) const { return bound_[index]; }
  bool has(size_t index) const { return bound_[index] != nullptr; }
  Value value_or(size_t index, Value fallback) const {
    return bound_[index] ? *bound_[index] : std::move(fallback);
  }

 private:
  std::vector<const Value*> bound_;
};

// jinja2 filter-attribute lookup: "a.b.0" via getitem, with integer path components.
Value get_attribute_path(Interpreter& interp, const Value& item, const Value& attribute);

// HTML escaping as markupsafe.escape.
std::string html_escape(std::string_view s);

}  // namespace pd::jinja
