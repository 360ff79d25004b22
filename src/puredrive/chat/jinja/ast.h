// Syntax tree of a parsed template, one node type per jinja2.nodes class that chat templates use.
// Built once by the parser and shared read-only by every render.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "puredrive/chat/jinja/value.h"

namespace pd::jinja::ast {

struct Location {
  int line = 0;
  int column = 0;
};

enum class ExprKind : uint8_t {
  kConst,
  kName,
  kGetattr,
  kGetitem,
  kSlice,
  kCall,
  kFilter,
  kTest,
  kUnary,
  kBinary,
  kAnd,
  kOr,
  kConcat,
  kCompare,
  kCondExpr,
  kList,
  kTuple,
  kDict,
  kNsRef,
};

struct Expr {
  explicit Expr(ExprKind k, Location l) : kind(k), loc(l) {}
  virtual ~Expr() = default;
  ExprKind kind;
  Location loc;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Const : Expr {
  Const(Location l, Value v) : Expr(ExprKind::kConst, l), value(std::move(v)) {}
  Value value;
};

struct Name : Expr {
  Name(Location l, std::string n) : Expr(ExprKind::kName, l), name(std::move(n)) {}
  std::string name;
};

struct NsRef : Expr {  // assignment target `ns.attr`
  NsRef(Location l, std::string n, std::string a)
      : Expr(ExprKind::kNsRef, l), name(std::move(n)), attr(std::move(a)) {}
  std::string name;
  std::string attr;
};

struct Getattr : Expr {
  Getattr(Location l, ExprPtr o, std::string a)
      : Expr(ExprKind::kGetattr, l), obj(std::move(o)), attr(std::move(a)) {}
  ExprPtr obj;
  std::string attr;
};

struct Getitem : Expr {
  Getitem(Location l, ExprPtr o, ExprPtr i)
      : Expr(ExprKind::kGetitem, l), obj(std::move(o)), index(std::move(i)) {}
  ExprPtr obj;
  ExprPtr index;  // may be a Slice
};

struct Slice : Expr {
  explicit Slice(Location l) : Expr(ExprKind::kSlice, l) {}
  ExprPtr start, stop, step;  // each optional
};

struct Keyword {
  std::string name;
  ExprPtr value;
};

struct CallArgsExpr {
  std::vector<ExprPtr> args;
  std::vector<Keyword> kwargs;
  ExprPtr dyn_args;    // *args
  ExprPtr dyn_kwargs;  // **kwargs
};

struct Call : Expr {
  Call(Location l, ExprPtr c) : Expr(ExprKind::kCall, l), callee(std::move(c)) {}
  ExprPtr callee;
  CallArgsExpr args;
};

struct Filter : Expr {  // also used for `{% filter %}` blocks and `{% set x | f %}` (node == nullptr)
  Filter(Location l, ExprPtr n, std::string nm)
      : Expr(ExprKind::kFilter, l), node(std::move(n)), name(std::move(nm)) {}
  ExprPtr node;
  std::string name;
  CallArgsExpr args;
  bool checked_at_parse = false;  // unknown names outside `if` blocks fail at parse time, like jinja2
};

struct Test : Expr {
  Test(Location l, ExprPtr n, std::string nm)
      : Expr(ExprKind::kTest, l), node(std::move(n)), name(std::move(nm)) {}
  ExprPtr node;
  std::string name;
  CallArgsExpr args;
};

enum class UnaryOp : uint8_t { kNeg, kPos, kNot };
struct Unary : Expr {
  Unary(Location l, UnaryOp o, ExprPtr e) : Expr(ExprKind::kUnary, l), op(o), operand(std::move(e)) {}
  UnaryOp op;
  ExprPtr operand;
};

enum class BinaryOp : uint8_t { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow };
struct Binary : Expr {
  Binary(Location l, BinaryOp o, ExprPtr a, ExprPtr b)
      : Expr(ExprKind::kBinary, l), op(o), left(std::move(a)), right(std::move(b)) {}
  BinaryOp op;
  ExprPtr left, right;
};

struct Logical : Expr {  // kAnd / kOr
  Logical(ExprKind k, Location l, ExprPtr a, ExprPtr b)
      : Expr(k, l), left(std::move(a)), right(std::move(b)) {}
  ExprPtr left, right;
};

struct Concat : Expr {
  explicit Concat(Location l) : Expr(ExprKind::kConcat, l) {}
  std::vector<ExprPtr> parts;
};

enum class CompareOp : uint8_t { kEq, kNe, kLt, kLtEq, kGt, kGtEq, kIn, kNotIn };
struct Compare : Expr {
  Compare(Location l, ExprPtr e) : Expr(ExprKind::kCompare, l), first(std::move(e)) {}
  ExprPtr first;
  std::vector<std::pair<CompareOp, ExprPtr>> ops;
};

struct CondExpr : Expr {
  explicit CondExpr(Location l) : Expr(ExprKind::kCondExpr, l) {}
  ExprPtr test, then_expr, else_expr;  // else_expr optional: undefined when missing
};

struct Sequence : Expr {  // kList / kTuple
  Sequence(ExprKind k, Location l) : Expr(k, l) {}
  std::vector<ExprPtr> items;
};

struct DictLit : Expr {
  explicit DictLit(Location l) : Expr(ExprKind::kDict, l) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};

// ---- statements ----

enum class StmtKind : uint8_t {
  kText,
  kPrint,
  kIf,
  kFor,
  kAssign,
  kAssignBlock,
  kMacro,
  kCallBlock,
  kFilterBlock,
  kWith,
  kBreak,
  kContinue,
  kScopedBody,   // {% generation %}, {% block %}, {% autoescape false %}: the body, inline
  kUnsupported,  // include / import / extends: an error when executed
};

struct Stmt {
  Stmt(StmtKind k, Location l) : kind(k), loc(l) {}
  virtual ~Stmt() = default;
  StmtKind kind;
  Location loc;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Text : Stmt {
  Text(Location l, std::string t) : Stmt(StmtKind::kText, l), text(std::move(t)) {}
  std::string text;
};

struct Print : Stmt {
  Print(Location l, ExprPtr e) : Stmt(StmtKind::kPrint, l), expr(std::move(e)) {}
  ExprPtr expr;
};

struct If : Stmt {
  explicit If(Location l) : Stmt(StmtKind::kIf, l) {}
  std::vector<std::pair<ExprPtr, Body>> branches;  // if + elifs
  Body else_body;
};

struct For : Stmt {
  explicit For(Location l) : Stmt(StmtKind::kFor, l) {}
  ExprPtr target;  // Name or Tuple of Names
  ExprPtr iter;
  ExprPtr filter;  // optional `if` clause
  bool recursive = false;
  Body body;
  Body else_body;
};

struct Assign : Stmt {
  Assign(Location l, ExprPtr t, ExprPtr v)
      : Stmt(StmtKind::kAssign, l), target(std::move(t)), value(std::move(v)) {}
  ExprPtr target;  // Name, NsRef or Tuple
  ExprPtr value;
};

struct AssignBlock : Stmt {
  explicit AssignBlock(Location l) : Stmt(StmtKind::kAssignBlock, l) {}
  ExprPtr target;
  ExprPtr filter;  // Filter chain with a null innermost node, optional
  Body body;
};

struct MacroDef : Stmt {  // also the signature of a call block's caller
  explicit MacroDef(Location l) : Stmt(StmtKind::kMacro, l) {}
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // for the last defaults.size() params
  Body body;
  bool uses_caller = false;
  bool uses_varargs = false;
  bool uses_kwargs = false;
};

struct CallBlock : Stmt {
  explicit CallBlock(Location l) : Stmt(StmtKind::kCallBlock, l) {}
  ExprPtr call;                      // a Call expression
  std::shared_ptr<MacroDef> caller;  // the block body as the `caller` macro
};

struct FilterBlock : Stmt {
  explicit FilterBlock(Location l) : Stmt(StmtKind::kFilterBlock, l) {}
  ExprPtr filter;  // Filter chain with a null innermost node
  Body body;
};

struct With : Stmt {
  explicit With(Location l) : Stmt(StmtKind::kWith, l) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> assignments;
  Body body;
};

struct ScopedBody : Stmt {
  explicit ScopedBody(Location l) : Stmt(StmtKind::kScopedBody, l) {}
  Body body;
};

struct Unsupported : Stmt {
  Unsupported(Location l, std::string w) : Stmt(StmtKind::kUnsupported, l), what(std::move(w)) {}
  std::string what;
};

struct Program {
  Body body;
};

}  // namespace pd::jinja::ast
