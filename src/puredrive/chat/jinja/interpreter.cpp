#include "puredrive/chat/jinja/interpreter.h"

#include <algorithm>

#include "puredrive/chat/jinja/objects.h"

namespace pd::jinja {

void raise_undefined(const Value& undefined) {
  const UndefinedInfo* info = undefined.undefined_info();
  if (info == nullptr) fail(ErrorKind::kUndefined, "value is undefined");
  throw TemplateError(info->unsafe ? ErrorKind::kSecurity : ErrorKind::kUndefined, info->message());
}

Interpreter::Interpreter(RenderLimits limits, std::optional<std::tm> fixed_now)
    : limits_(limits), fixed_now_(fixed_now) {}

Interpreter::~Interpreter() {
  for (const auto& weak : tracked_) {
    if (auto obj = weak.lock()) obj->clear_references();
  }
}

std::weak_ptr<Scope> Interpreter::retain(const ScopePtr& scope) {
  if (std::find(retained_.begin(), retained_.end(), scope) == retained_.end()) retained_.push_back(scope);
  return scope;
}

Interpreter::CallDepthGuard::CallDepthGuard(Interpreter& i) : interp(i) {
  if (++interp.call_depth_ > interp.limits_.max_call_depth) {
    --interp.call_depth_;
    fail(ErrorKind::kLimit,
         "maximum recursion depth exceeded: more than {} nested macro calls or recursive loops",
         interp.limits_.max_call_depth);
  }
}

std::tm Interpreter::now() const {
  if (fixed_now_) return *fixed_now_;
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  return tm;
}

void Interpreter::check_size(size_t size) const {
  if (size > limits_.max_output_bytes) {
    fail(ErrorKind::kLimit, "output or intermediate value larger than the {}-byte limit",
         limits_.max_output_bytes);
  }
}

void Interpreter::count_iteration() {
  if (++iterations_ > limits_.max_loop_iterations) {
    fail(ErrorKind::kLimit, "more than {} loop iterations", limits_.max_loop_iterations);
  }
}

void Interpreter::emit(std::string& out, std::string_view text) const {
  check_size(out.size() + text.size());
  out.append(text);
}

std::string Interpreter::render(const ast::Program& program, const Dict& context) {
  auto globals = std::make_shared<Scope>(nullptr);
  for (const auto& [k, v] : context.items()) {
    if (k.is_string()) globals->set(k.str(), v);
  }
  auto top = std::make_shared<Scope>(globals);
  std::string out;
  exec(program.body, top, out);
  return out;
}

// ---- statements ----------------------------------------------------------------------------------

Interpreter::Flow Interpreter::exec(const ast::Body& body, const ScopePtr& scope, std::string& out) {
  for (const auto& stmt : body) {
    const Flow flow = exec_stmt(*stmt, scope, out);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec_stmt(const ast::Stmt& stmt, const ScopePtr& scope, std::string& out) {
  try {
    switch (stmt.kind) {
      case ast::StmtKind::kText:
        emit(out, static_cast<const ast::Text&>(stmt).text);
        return Flow::kNormal;
      case ast::StmtKind::kPrint: {
        const Value v = eval(*static_cast<const ast::Print&>(stmt).expr, scope);
        if (v.is_string()) {
          emit(out, v.str());
        } else {
          emit(out, py_str(v));
        }
        return Flow::kNormal;
      }
      case ast::StmtKind::kIf: {
        const auto& node = static_cast<const ast::If&>(stmt);
        for (const auto& [test, body] : node.branches) {
          if (eval(*test, scope).truthy()) return exec(body, scope, out);
        }
        return exec(node.else_body, scope, out);
      }
      case ast::StmtKind::kFor: {
        const auto& node = static_cast<const ast::For&>(stmt);
        const Value iterable = eval(*node.iter, scope);
        run_loop(node, scope, iterable, 0, out);
        return Flow::kNormal;
      }
      case ast::StmtKind::kAssign: {
        const auto& node = static_cast<const ast::Assign&>(stmt);
        exec_assign(*node.target, eval(*node.value, scope), scope);
        return Flow::kNormal;
      }
      case ast::StmtKind::kAssignBlock: {
        const auto& node = static_cast<const ast::AssignBlock&>(stmt);
        auto inner = std::make_shared<Scope>(scope);
        std::string text;
        exec(node.body, inner, text);
        Value value = Value::from_string(std::move(text));
        if (node.filter) value = apply_filter_chain(*node.filter, std::move(value), scope);
        exec_assign(*node.target, std::move(value), scope);
        return Flow::kNormal;
      }
      case ast::StmtKind::kMacro: {
        const auto& node = static_cast<const ast::MacroDef&>(stmt);
        scope->set(node.name, Value::from_object(std::make_shared<Macro>(&node, retain(scope))));
        return Flow::kNormal;
      }
      case ast::StmtKind::kCallBlock: {
        const auto& node = static_cast<const ast::CallBlock&>(stmt);
        const auto& call = static_cast<const ast::Call&>(*node.call);
        const Value callee = eval(*call.callee, scope);
        CallArgs args = eval_args(call.args, scope);
        args.kwargs.emplace_back(
            "caller", Value::from_object(std::make_shared<Macro>(node.caller.get(), retain(scope))));
        const Value result = this->call(callee, args);
        emit(out, py_str(result));
        return Flow::kNormal;
      }
      case ast::StmtKind::kFilterBlock: {
        const auto& node = static_cast<const ast::FilterBlock&>(stmt);
        auto inner = std::make_shared<Scope>(scope);
        std::string text;
        exec(node.body, inner, text);
        const Value v = apply_filter_chain(*node.filter, Value::from_string(std::move(text)), scope);
        emit(out, py_str(v));
        return Flow::kNormal;
      }
      case ast::StmtKind::kWith: {
        const auto& node = static_cast<const ast::With&>(stmt);
        auto inner = std::make_shared<Scope>(scope);
        for (const auto& [target, value] : node.assignments) exec_assign(*target, eval(*value, scope), inner);
        return exec(node.body, inner, out);
      }
      case ast::StmtKind::kBreak:
        return Flow::kBreak;
      case ast::StmtKind::kContinue:
        return Flow::kContinue;
      case ast::StmtKind::kScopedBody:
        return exec(static_cast<const ast::ScopedBody&>(stmt).body, scope, out);
      case ast::StmtKind::kUnsupported:
        fail(ErrorKind::kUnsupported, "{} are not supported",
             static_cast<const ast::Unsupported&>(stmt).what);
    }
  } catch (TemplateError& e) {
    if (!e.has_location()) e.set_location(stmt.loc.line, stmt.loc.column);
    throw;
  }
  return Flow::kNormal;
}

void Interpreter::run_loop(const ast::For& node, const ScopePtr& scope, const Value& iterable, int depth0,
                           std::string& out) {
  Value items = iterable.is_list() ? iterable : Value::from_list(iterate(iterable));
  auto loop_scope = std::make_shared<Scope>(scope);
  if (node.filter) {
    List kept;
    for (const Value& item : items.list()) {
      count_iteration();
      loop_scope->clear();
      exec_assign(*node.target, item, loop_scope);
      if (eval(*node.filter, loop_scope).truthy()) kept.push_back(item);
    }
    items = Value::from_list(std::move(kept));
  }
  const List& list = items.list();
  if (list.empty()) {
    loop_scope->clear();
    exec(node.else_body, loop_scope, out);
    return;
  }
  auto ctx = std::make_shared<LoopContext>(items, depth0, &node,
                                           node.recursive ? retain(scope) : std::weak_ptr<Scope>());
  track(ctx);
  const Value loop_value = Value::from_object(ctx);
  for (size_t i = 0; i < list.size(); ++i) {
    count_iteration();
    loop_scope->clear();
    ctx->index0 = i;
    loop_scope->set("loop", loop_value);
    exec_assign(*node.target, list[i], loop_scope);
    if (exec(node.body, loop_scope, out) == Flow::kBreak) break;
  }
}

void Interpreter::exec_assign(const ast::Expr& target, Value value, const ScopePtr& scope) {
  switch (target.kind) {
    case ast::ExprKind::kName:
      scope->set(static_cast<const ast::Name&>(target).name, std::move(value));
      return;
    case ast::ExprKind::kNsRef: {
      const auto& ref = static_cast<const ast::NsRef&>(target);
      const Value* ns_value = scope->lookup(ref.name);
      auto* ns = ns_value ? ns_value->object_as<Namespace>() : nullptr;
      if (ns == nullptr) fail(ErrorKind::kType, "cannot assign attribute on non-namespace object");
      ns->set(ref.attr, std::move(value));
      return;
    }
    case ast::ExprKind::kTuple: {
      const auto& names = static_cast<const ast::Sequence&>(target).items;
      const List items = iterate(value);
      if (items.size() > names.size()) {
        fail(ErrorKind::kValue, "too many values to unpack (expected {})", names.size());
      }
      if (items.size() < names.size()) {
        fail(ErrorKind::kValue, "not enough values to unpack (expected {}, got {})", names.size(),
             items.size());
      }
      for (size_t i = 0; i < names.size(); ++i) exec_assign(*names[i], items[i], scope);
      return;
    }
    default:
      fail(ErrorKind::kSyntax, "can't assign to this expression");
  }
}

Value Interpreter::apply_filter_chain(const ast::Expr& filter, Value input, const ScopePtr& scope) {
  const auto& f = static_cast<const ast::Filter&>(filter);
  Value inner = f.node ? apply_filter_chain(*f.node, std::move(input), scope) : std::move(input);
  CallArgs args = eval_args(f.args, scope);
  return apply_filter(f.name, inner, args);
}

// ---- expressions ---------------------------------------------------------------------------------

Value Interpreter::eval(const ast::Expr& expr, const ScopePtr& scope) {
  try {
    return eval_inner(expr, scope);
  } catch (TemplateError& e) {
    if (!e.has_location()) e.set_location(expr.loc.line, expr.loc.column);
    throw;
  }
}

Value Interpreter::lookup_name(const ast::Name& node, const ScopePtr& scope) {
  if (const Value* v = scope->lookup(node.name)) return *v;
  Value builtin;
  if (lookup_builtin(node.name, builtin)) return builtin;
  return Value::undefined_name(node.name);
}

CallArgs Interpreter::eval_args(const ast::CallArgsExpr& args, const ScopePtr& scope) {
  CallArgs out;
  out.args.reserve(args.args.size());
  for (const auto& a : args.args) out.args.push_back(eval(*a, scope));
  if (args.dyn_args) {
    for (Value& v : iterate(eval(*args.dyn_args, scope))) out.args.push_back(std::move(v));
  }
  for (const auto& kw : args.kwargs) out.kwargs.emplace_back(kw.name, eval(*kw.value, scope));
  if (args.dyn_kwargs) {
    const Value d = eval(*args.dyn_kwargs, scope);
    if (!d.is_dict()) fail(ErrorKind::kType, "argument after ** must be a mapping, not {}", d.type_name());
    for (const auto& [k, v] : d.dict().items()) {
      if (!k.is_string()) fail(ErrorKind::kType, "keywords must be strings");
      out.kwargs.emplace_back(k.str(), v);
    }
  }
  return out;
}

Value Interpreter::eval_inner(const ast::Expr& expr, const ScopePtr& scope) {
  switch (expr.kind) {
    case ast::ExprKind::kConst:
      return static_cast<const ast::Const&>(expr).value;
    case ast::ExprKind::kName:
      return lookup_name(static_cast<const ast::Name&>(expr), scope);
    case ast::ExprKind::kGetattr: {
      const auto& node = static_cast<const ast::Getattr&>(expr);
      return getattr(eval(*node.obj, scope), node.attr);
    }
    case ast::ExprKind::kGetitem:
      return eval_getitem(static_cast<const ast::Getitem&>(expr), scope);
    case ast::ExprKind::kCall:
      return eval_call(static_cast<const ast::Call&>(expr), scope);
    case ast::ExprKind::kFilter: {
      const auto& node = static_cast<const ast::Filter&>(expr);
      const Value input = node.node ? eval(*node.node, scope) : Value();
      CallArgs args = eval_args(node.args, scope);
      return apply_filter(node.name, input, args);
    }
    case ast::ExprKind::kTest: {
      const auto& node = static_cast<const ast::Test&>(expr);
      const Value input = eval(*node.node, scope);
      CallArgs args = eval_args(node.args, scope);
      return Value::from_bool(apply_test(node.name, input, args));
    }
    case ast::ExprKind::kUnary: {
      const auto& node = static_cast<const ast::Unary&>(expr);
      const Value v = eval(*node.operand, scope);
      if (node.op == ast::UnaryOp::kNot) return Value::from_bool(!v.truthy());
      if (v.is_undefined()) raise_undefined(v);
      const bool neg = node.op == ast::UnaryOp::kNeg;
      if (v.is_float()) return Value::from_float(neg ? -v.as_float() : v.as_float());
      if (v.is_int() || v.is_bool()) {
        if (neg && v.as_int() == INT64_MIN) fail(ErrorKind::kValue, "integer overflow");
        return Value::from_int(neg ? -v.as_int() : v.as_int());
      }
      fail(ErrorKind::kType, "bad operand type for unary {}: '{}'", neg ? '-' : '+', v.type_name());
    }
    case ast::ExprKind::kBinary: {
      const auto& node = static_cast<const ast::Binary&>(expr);
      const Value a = eval(*node.left, scope);
      const Value b = eval(*node.right, scope);
      return py_binary(*this, node.op, a, b);
    }
    case ast::ExprKind::kAnd: {
      const auto& node = static_cast<const ast::Logical&>(expr);
      Value left = eval(*node.left, scope);
      if (!left.truthy()) return left;
      return eval(*node.right, scope);
    }
    case ast::ExprKind::kOr: {
      const auto& node = static_cast<const ast::Logical&>(expr);
      Value left = eval(*node.left, scope);
      if (left.truthy()) return left;
      return eval(*node.right, scope);
    }
    case ast::ExprKind::kConcat: {
      const auto& node = static_cast<const ast::Concat&>(expr);
      std::string out;
      for (const auto& part : node.parts) {
        py_str(eval(*part, scope), out);
        check_size(out.size());
      }
      return Value::from_string(std::move(out));
    }
    case ast::ExprKind::kCompare:
      return eval_compare(static_cast<const ast::Compare&>(expr), scope);
    case ast::ExprKind::kCondExpr: {
      const auto& node = static_cast<const ast::CondExpr&>(expr);
      if (eval(*node.test, scope).truthy()) return eval(*node.then_expr, scope);
      if (node.else_expr) return eval(*node.else_expr, scope);
      UndefinedInfo info;
      info.hint = fmt::format(
          "the inline if-expression on line {} evaluated to false and no else section was defined.",
          expr.loc.line);
      return Value::undefined(std::move(info));
    }
    case ast::ExprKind::kList:
    case ast::ExprKind::kTuple: {
      const auto& node = static_cast<const ast::Sequence&>(expr);
      List items;
      items.reserve(node.items.size());
      for (const auto& item : node.items) items.push_back(eval(*item, scope));
      return Value::from_list(std::move(items),
                              expr.kind == ast::ExprKind::kTuple ? ListFlavor::kTuple : ListFlavor::kList);
    }
    case ast::ExprKind::kDict: {
      const auto& node = static_cast<const ast::DictLit&>(expr);
      Dict d;
      d.reserve(node.items.size());
      for (const auto& [k, v] : node.items) {
        Value key = eval(*k, scope);
        if (key.is_unhashable()) fail(ErrorKind::kType, "unhashable type: '{}'", key.type_name());
        if (key.is_dict()) fail(ErrorKind::kType, "unhashable type: 'dict'");
        d.set(std::move(key), eval(*v, scope));
      }
      return Value::from_dict(std::move(d));
    }
    case ast::ExprKind::kSlice:
    case ast::ExprKind::kNsRef:
      break;
  }
  fail(ErrorKind::kSyntax, "invalid expression here");
}

Value Interpreter::eval_call(const ast::Call& node, const ScopePtr& scope) {
  if (node.callee->kind == ast::ExprKind::kGetattr) {
    // obj.method(...): call str/list/dict methods directly instead of building a bound method.
    const auto& ga = static_cast<const ast::Getattr&>(*node.callee);
    const Value obj = eval(*ga.obj, scope);
    if ((obj.is_string() || obj.is_list() || obj.is_dict()) && has_method(obj, ga.attr)) {
      CallArgs args = eval_args(node.args, scope);
      return call_method(*this, obj, ga.attr, args);
    }
    Value fn;
    try {
      fn = getattr(obj, ga.attr);
    } catch (TemplateError& e) {
      if (!e.has_location()) e.set_location(ga.loc.line, ga.loc.column);
      throw;
    }
    CallArgs args = eval_args(node.args, scope);
    return call(fn, args);
  }
  const Value fn = eval(*node.callee, scope);
  CallArgs args = eval_args(node.args, scope);
  return call(fn, args);
}

Value Interpreter::call(const Value& callee, CallArgs& args) {
  if (callee.is_object() && callee.object()->callable()) return callee.object()->call(*this, args);
  if (callee.is_undefined()) raise_undefined(callee);
  fail(ErrorKind::kType, "'{}' object is not callable", callee.type_name());
}

Value Interpreter::eval_compare(const ast::Compare& node, const ScopePtr& scope) {
  Value left = eval(*node.first, scope);
  for (const auto& [op, expr] : node.ops) {
    Value right = eval(*expr, scope);
    bool ok = false;
    switch (op) {
      case ast::CompareOp::kEq:
        ok = py_equal(left, right);
        break;
      case ast::CompareOp::kNe:
        ok = !py_equal(left, right);
        break;
      case ast::CompareOp::kLt:
        ok = py_compare(left, right, "<") < 0;
        break;
      case ast::CompareOp::kLtEq:
        ok = py_compare(left, right, "<=") <= 0;
        break;
      case ast::CompareOp::kGt:
        ok = py_compare(left, right, ">") > 0;
        break;
      case ast::CompareOp::kGtEq:
        ok = py_compare(left, right, ">=") >= 0;
        break;
      case ast::CompareOp::kIn:
        ok = contains(right, left);
        break;
      case ast::CompareOp::kNotIn:
        ok = !contains(right, left);
        break;
    }
    if (!ok) return Value::from_bool(false);
    left = std::move(right);
  }
  return Value::from_bool(true);
}

}  // namespace pd::jinja
