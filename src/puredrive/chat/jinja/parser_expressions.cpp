// The expressions of the jinja parser (parser_internal.h): jinja2's precedence from the conditional
// expression down to primaries, postfixes, filters and tests.

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "puredrive/chat/jinja/parser.h"
#include "puredrive/chat/jinja/parser_internal.h"

namespace pd::jinja::parsing {

bool Parser::is_tuple_end(std::initializer_list<std::string_view> extra_end) const {
  const Token& t = cur();
  if (t.type == TokenType::kVarEnd || t.type == TokenType::kBlockEnd ||
      (t.type == TokenType::kOperator && t.op == Op::kRParen)) {
    return true;
  }
  if (t.type == TokenType::kName) {
    return std::find(extra_end.begin(), extra_end.end(), t.text) != extra_end.end();
  }
  return false;
}

ast::ExprPtr Parser::parse_tuple(bool simplified, bool with_condexpr,
                                 std::initializer_list<std::string_view> extra_end, bool explicit_parentheses,
                                 bool with_namespace) {
  const ast::Location start = here();
  std::vector<ast::ExprPtr> items;
  bool is_tuple = false;
  for (;;) {
    if (!items.empty()) expect_op(Op::kComma);
    if (is_tuple_end(extra_end)) break;
    items.push_back(simplified ? parse_primary(with_namespace) : parse_expression(with_condexpr));
    if (is_op(Op::kComma)) {
      is_tuple = true;
    } else {
      break;
    }
  }
  if (!is_tuple) {
    if (!items.empty()) return std::move(items.front());
    if (!explicit_parentheses) fail_here("Expected an expression");
  }
  auto node = std::make_unique<ast::Sequence>(ast::ExprKind::kTuple, start);
  node->items = std::move(items);
  return node;
}

ast::ExprPtr Parser::parse_expression(bool with_condexpr) {
  DepthGuard guard(*this);
  return with_condexpr ? parse_condexpr() : parse_or();
}

ast::ExprPtr Parser::parse_condexpr() {
  ast::Location start = here();
  auto expr1 = parse_or();
  while (skip_name("if")) {
    auto node = std::make_unique<ast::CondExpr>(start);
    soft_.push_back(true);
    node->test = parse_or();
    if (skip_name("else")) node->else_expr = parse_condexpr();
    soft_.pop_back();
    node->then_expr = std::move(expr1);
    expr1 = std::move(node);
    start = here();
  }
  return expr1;
}

ast::ExprPtr Parser::parse_or() {
  auto left = parse_and();
  while (is_name("or")) {
    const ast::Location l = here();
    next();
    left = std::make_unique<ast::Logical>(ast::ExprKind::kOr, l, std::move(left), parse_and());
  }
  return left;
}

ast::ExprPtr Parser::parse_and() {
  auto left = parse_not();
  while (is_name("and")) {
    const ast::Location l = here();
    next();
    left = std::make_unique<ast::Logical>(ast::ExprKind::kAnd, l, std::move(left), parse_not());
  }
  return left;
}

ast::ExprPtr Parser::parse_not() {
  if (is_name("not")) {
    DepthGuard guard(*this);
    const ast::Location l = here();
    next();
    return std::make_unique<ast::Unary>(l, ast::UnaryOp::kNot, parse_not());
  }
  return parse_compare();
}

ast::ExprPtr Parser::parse_compare() {
  const ast::Location l = here();
  auto expr = parse_math1();
  std::unique_ptr<ast::Compare> cmp;
  for (;;) {
    ast::CompareOp op;
    if (cur().type == TokenType::kOperator &&
        (cur().op == Op::kEq || cur().op == Op::kNe || cur().op == Op::kLt || cur().op == Op::kLtEq ||
         cur().op == Op::kGt || cur().op == Op::kGtEq)) {
      switch (next().op) {
        case Op::kEq:
          op = ast::CompareOp::kEq;
          break;
        case Op::kNe:
          op = ast::CompareOp::kNe;
          break;
        case Op::kLt:
          op = ast::CompareOp::kLt;
          break;
        case Op::kLtEq:
          op = ast::CompareOp::kLtEq;
          break;
        case Op::kGt:
          op = ast::CompareOp::kGt;
          break;
        default:
          op = ast::CompareOp::kGtEq;
          break;
      }
    } else if (skip_name("in")) {
      op = ast::CompareOp::kIn;
    } else if (is_name("not") && look().type == TokenType::kName && look().text == "in") {
      next();
      next();
      op = ast::CompareOp::kNotIn;
    } else {
      break;
    }
    if (!cmp) cmp = std::make_unique<ast::Compare>(l, std::move(expr));
    cmp->ops.emplace_back(op, parse_math1());
  }
  if (cmp) return cmp;
  return expr;
}

ast::ExprPtr Parser::parse_math1() {
  auto left = parse_concat();
  while (is_op(Op::kAdd) || is_op(Op::kSub)) {
    const ast::Location l = here();
    const auto op = next().op == Op::kAdd ? ast::BinaryOp::kAdd : ast::BinaryOp::kSub;
    left = std::make_unique<ast::Binary>(l, op, std::move(left), parse_concat());
  }
  return left;
}

ast::ExprPtr Parser::parse_concat() {
  const ast::Location l = here();
  auto first = parse_math2();
  if (!is_op(Op::kTilde)) return first;
  auto node = std::make_unique<ast::Concat>(l);
  node->parts.push_back(std::move(first));
  while (skip_op(Op::kTilde)) node->parts.push_back(parse_math2());
  return node;
}

ast::ExprPtr Parser::parse_math2() {
  auto left = parse_pow();
  for (;;) {
    ast::BinaryOp op;
    if (is_op(Op::kMul)) {
      op = ast::BinaryOp::kMul;
    } else if (is_op(Op::kDiv)) {
      op = ast::BinaryOp::kDiv;
    } else if (is_op(Op::kFloorDiv)) {
      op = ast::BinaryOp::kFloorDiv;
    } else if (is_op(Op::kMod)) {
      op = ast::BinaryOp::kMod;
    } else {
      break;
    }
    const ast::Location l = here();
    next();
    left = std::make_unique<ast::Binary>(l, op, std::move(left), parse_pow());
  }
  return left;
}

ast::ExprPtr Parser::parse_pow() {
  auto left = parse_unary(true);
  while (is_op(Op::kPow)) {
    const ast::Location l = here();
    next();
    left = std::make_unique<ast::Binary>(l, ast::BinaryOp::kPow, std::move(left), parse_unary(true));
  }
  return left;
}

ast::ExprPtr Parser::parse_unary(bool with_filter) {
  DepthGuard guard(*this);
  const ast::Location l = here();
  ast::ExprPtr node;
  if (skip_op(Op::kSub)) {
    node = std::make_unique<ast::Unary>(l, ast::UnaryOp::kNeg, parse_unary(false));
  } else if (skip_op(Op::kAdd)) {
    node = std::make_unique<ast::Unary>(l, ast::UnaryOp::kPos, parse_unary(false));
  } else {
    node = parse_primary(false);
  }
  node = parse_postfix(std::move(node));
  if (with_filter) node = parse_filter_expr(std::move(node));
  return node;
}

ast::ExprPtr Parser::parse_primary(bool with_namespace) {
  const Token& t = cur();
  const ast::Location l = loc(t);
  switch (t.type) {
    case TokenType::kName: {
      next();
      if (t.text == "true" || t.text == "True")
        return std::make_unique<ast::Const>(l, Value::from_bool(true));
      if (t.text == "false" || t.text == "False")
        return std::make_unique<ast::Const>(l, Value::from_bool(false));
      if (t.text == "none" || t.text == "None") return std::make_unique<ast::Const>(l, Value::none());
      if (with_namespace && is_op(Op::kDot)) {
        next();
        const Token& attr = expect_name();
        note_name(t.text);
        return std::make_unique<ast::NsRef>(l, t.text, attr.text);
      }
      note_name(t.text);
      return std::make_unique<ast::Name>(l, t.text);
    }
    case TokenType::kString: {
      std::string text = next().text;
      while (cur().type == TokenType::kString) text += next().text;
      return std::make_unique<ast::Const>(l, Value::from_string(std::move(text)));
    }
    case TokenType::kInteger:
      next();
      return std::make_unique<ast::Const>(l, Value::from_int(t.int_value));
    case TokenType::kFloat:
      next();
      return std::make_unique<ast::Const>(l, Value::from_float(t.float_value));
    case TokenType::kOperator:
      if (t.op == Op::kLParen) {
        next();
        auto node = parse_tuple(false, true, {}, true);
        expect_op(Op::kRParen);
        return node;
      }
      if (t.op == Op::kLBracket) return parse_list();
      if (t.op == Op::kLBrace) return parse_dict();
      break;
    default:
      break;
  }
  fail_at(t, fmt::format("unexpected '{}'", describe(t)));
}

ast::ExprPtr Parser::parse_list() {
  const ast::Location l = here();
  expect_op(Op::kLBracket);
  auto node = std::make_unique<ast::Sequence>(ast::ExprKind::kList, l);
  while (!is_op(Op::kRBracket)) {
    if (!node->items.empty()) expect_op(Op::kComma);
    if (is_op(Op::kRBracket)) break;
    node->items.push_back(parse_expression(true));
  }
  expect_op(Op::kRBracket);
  return node;
}

ast::ExprPtr Parser::parse_dict() {
  const ast::Location l = here();
  expect_op(Op::kLBrace);
  auto node = std::make_unique<ast::DictLit>(l);
  while (!is_op(Op::kRBrace)) {
    if (!node->items.empty()) expect_op(Op::kComma);
    if (is_op(Op::kRBrace)) break;
    auto key = parse_expression(true);
    expect_op(Op::kColon);
    node->items.emplace_back(std::move(key), parse_expression(true));
  }
  expect_op(Op::kRBrace);
  return node;
}

ast::ExprPtr Parser::parse_postfix(ast::ExprPtr node) {
  for (;;) {
    if (is_op(Op::kDot) || is_op(Op::kLBracket)) {
      node = parse_subscript(std::move(node));
    } else if (is_op(Op::kLParen)) {
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ast::ExprPtr Parser::parse_filter_expr(ast::ExprPtr node) {
  for (;;) {
    if (is_op(Op::kPipe)) {
      node = parse_filter(std::move(node), false);
    } else if (is_name("is")) {
      node = parse_test(std::move(node));
    } else if (is_op(Op::kLParen)) {
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ast::ExprPtr Parser::parse_subscript(ast::ExprPtr node) {
  const Token& t = next();
  if (t.op == Op::kDot) {
    const Token& attr = cur();
    next();
    if (attr.type == TokenType::kName)
      return std::make_unique<ast::Getattr>(loc(t), std::move(node), attr.text);
    if (attr.type != TokenType::kInteger) fail_at(attr, "expected name or number");
    return std::make_unique<ast::Getitem>(
        loc(t), std::move(node), std::make_unique<ast::Const>(loc(attr), Value::from_int(attr.int_value)));
  }
  std::vector<ast::ExprPtr> args;
  while (!is_op(Op::kRBracket)) {
    if (!args.empty()) expect_op(Op::kComma);
    args.push_back(parse_subscribed());
  }
  expect_op(Op::kRBracket);
  if (args.size() == 1)
    return std::make_unique<ast::Getitem>(loc(t), std::move(node), std::move(args.front()));
  auto tuple = std::make_unique<ast::Sequence>(ast::ExprKind::kTuple, loc(t));
  tuple->items = std::move(args);
  return std::make_unique<ast::Getitem>(loc(t), std::move(node), std::move(tuple));
}

ast::ExprPtr Parser::parse_subscribed() {
  const ast::Location l = here();
  auto slice = std::make_unique<ast::Slice>(l);
  if (skip_op(Op::kColon)) {
    // [:...]
  } else {
    auto node = parse_expression(true);
    if (!skip_op(Op::kColon)) return node;
    slice->start = std::move(node);
  }
  if (!is_op(Op::kColon) && !is_op(Op::kRBracket) && !is_op(Op::kComma)) slice->stop = parse_expression(true);
  if (skip_op(Op::kColon)) {
    if (!is_op(Op::kRBracket) && !is_op(Op::kComma)) slice->step = parse_expression(true);
  }
  return slice;
}

ast::CallArgsExpr Parser::parse_call_args() {
  const Token& open = cur();
  expect_op(Op::kLParen);
  ast::CallArgsExpr out;
  bool require_comma = false;
  auto ensure = [&](bool ok) {
    if (!ok) fail_at(open, "invalid syntax for function call expression");
  };
  while (!is_op(Op::kRParen)) {
    if (require_comma) {
      expect_op(Op::kComma);
      if (is_op(Op::kRParen)) break;
    }
    if (is_op(Op::kMul)) {
      ensure(!out.dyn_args && !out.dyn_kwargs);
      next();
      out.dyn_args = parse_expression(true);
    } else if (is_op(Op::kPow)) {
      ensure(!out.dyn_kwargs);
      next();
      out.dyn_kwargs = parse_expression(true);
    } else if (cur().type == TokenType::kName && look().type == TokenType::kOperator &&
               look().op == Op::kAssign) {
      ensure(!out.dyn_kwargs);
      std::string key = next().text;
      next();
      out.kwargs.push_back({std::move(key), parse_expression(true)});
    } else {
      ensure(!out.dyn_args && !out.dyn_kwargs && out.kwargs.empty());
      out.args.push_back(parse_expression(true));
    }
    require_comma = true;
  }
  expect_op(Op::kRParen);
  return out;
}

ast::ExprPtr Parser::parse_call(ast::ExprPtr callee) {
  // Errors of a call point at the callee (raise_exception(...) at its name).
  const ast::Location l = callee->loc;
  auto node = std::make_unique<ast::Call>(l, std::move(callee));
  node->args = parse_call_args();
  return node;
}

std::string Parser::parse_dotted_name() {
  std::string name = expect_name().text;
  while (skip_op(Op::kDot)) name += "." + expect_name().text;
  return name;
}

ast::ExprPtr Parser::parse_filter(ast::ExprPtr node, bool start_inline) {
  while (is_op(Op::kPipe) || start_inline) {
    if (!start_inline) next();
    const Token& t = cur();
    std::string name = parse_dotted_name();
    if (!soft() && !is_known_filter(name)) fail_at(t, fmt::format("No filter named '{}'.", name));
    auto filter = std::make_unique<ast::Filter>(loc(t), std::move(node), std::move(name));
    if (is_op(Op::kLParen)) filter->args = parse_call_args();
    node = std::move(filter);
    start_inline = false;
  }
  return node;
}

ast::ExprPtr Parser::parse_test(ast::ExprPtr node) {
  const Token& is_token = next();
  const bool negated = skip_name("not");
  const Token& t = cur();
  std::string name = parse_dotted_name();
  if (!soft() && !is_known_test(name)) fail_at(t, fmt::format("No test named '{}'.", name));
  auto test = std::make_unique<ast::Test>(loc(is_token), std::move(node), std::move(name));
  const Token& c = cur();
  const bool arg_start = c.type == TokenType::kName || c.type == TokenType::kString ||
                         c.type == TokenType::kInteger || c.type == TokenType::kFloat ||
                         (c.type == TokenType::kOperator &&
                          (c.op == Op::kLParen || c.op == Op::kLBracket || c.op == Op::kLBrace));
  if (is_op(Op::kLParen)) {
    test->args = parse_call_args();
  } else if (arg_start && !is_name("else") && !is_name("or") && !is_name("and")) {
    if (is_name("is")) fail_here("You cannot chain multiple tests with is");
    test->args.args.push_back(parse_postfix(parse_primary(false)));
  }
  if (negated) return std::make_unique<ast::Unary>(loc(is_token), ast::UnaryOp::kNot, std::move(test));
  return test;
}

void Parser::note_name(const std::string& name) {
  if (!name_refs_.empty()) name_refs_.back().insert(name);
}

}  // namespace pd::jinja::parsing
