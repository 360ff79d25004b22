// The recursive-descent parser behind parse_template (parser.h), one class in two files: the token stream
// and statements (parser.cpp), expressions (parser_expressions.cpp). Internal to the jinja library.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "puredrive/chat/jinja/ast.h"
#include "puredrive/chat/jinja/error.h"
#include "puredrive/chat/jinja/lexer.h"

namespace pd::jinja::parsing {

// Deep nesting of expressions or blocks is a hostile template, not a chat template: refuse it before
// the C++ stack runs out.
constexpr int kMaxNesting = 128;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  std::unique_ptr<ast::Program> run() {
    auto program = std::make_unique<ast::Program>();
    program->body = subparse({});
    if (cur().type != TokenType::kEof) fail_here("unexpected token");
    return program;
  }

 private:
  // ---- token stream ----
  const Token& cur() const { return toks_[pos_]; }
  const Token& look() const { return toks_[std::min(pos_ + 1, toks_.size() - 1)]; }
  const Token& next() {
    const Token& t = toks_[pos_];
    if (pos_ + 1 < toks_.size()) ++pos_;
    return t;
  }
  static ast::Location loc(const Token& t) { return {t.line, t.column}; }
  ast::Location here() const { return loc(cur()); }

  bool is_name(std::string_view n) const { return cur().type == TokenType::kName && cur().text == n; }
  bool is_op(Op op) const { return cur().type == TokenType::kOperator && cur().op == op; }
  bool skip_name(std::string_view n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  bool skip_op(Op op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }

  static std::string describe(const Token& t);

  [[noreturn]] void fail_at(const Token& t, const std::string& message) const {
    throw TemplateError(ErrorKind::kSyntax, message, t.line, t.column);
  }
  [[noreturn]] void fail_here(const std::string& message) const {
    fail_at(cur(), fmt::format("{}, got '{}'", message, describe(cur())));
  }

  void expect_op(Op op) {
    if (!skip_op(op)) fail_here(fmt::format("expected '{}'", op_text(op)));
  }
  const Token& expect_name() {
    if (cur().type != TokenType::kName) fail_here("expected name");
    return next();
  }
  void expect_name(std::string_view n) {
    if (!skip_name(n)) fail_here(fmt::format("expected '{}'", n));
  }
  void expect(TokenType type, const char* what) {
    if (cur().type != type) fail_here(fmt::format("expected {}", what));
    next();
  }

  struct DepthGuard {
    explicit DepthGuard(Parser& p) : parser(p) {
      if (++parser.depth_ > kMaxNesting) {
        parser.fail_at(parser.cur(), fmt::format("template nesting deeper than {} levels", kMaxNesting));
      }
    }
    ~DepthGuard() { --parser.depth_; }
    Parser& parser;
  };

  // ---- statements (parser.cpp) ----

  ast::Body subparse(std::initializer_list<std::string_view> end_tokens);
  // parse_statements of jinja2: optional ':', block end, body until one of end_tokens.
  ast::Body parse_statements(std::initializer_list<std::string_view> end_tokens, bool drop_needle);
  void parse_statement(ast::Body& out);
  ast::StmtPtr parse_for();
  ast::StmtPtr parse_if();
  ast::StmtPtr parse_set();
  // Parameters of a macro or call block: (a, b=1, ...)
  void parse_signature(ast::MacroDef& def);
  // Macro bodies: record whether they reference caller / varargs / kwargs (jinja2 decides the
  // macro's accepted arguments from that).
  void parse_macro_body(ast::MacroDef& def, std::string_view end_tag);
  ast::StmtPtr parse_macro();
  ast::StmtPtr parse_call_block();
  ast::StmtPtr parse_filter_block();
  ast::StmtPtr parse_with();
  ast::ExprPtr parse_assign_target(bool with_tuple, bool name_only,
                                   std::initializer_list<std::string_view> extra_end, bool with_namespace);
  void check_assignable(const ast::Expr& target);

  // ---- expressions (parser_expressions.cpp) ----

  bool is_tuple_end(std::initializer_list<std::string_view> extra_end) const;
  ast::ExprPtr parse_tuple(bool simplified, bool with_condexpr,
                           std::initializer_list<std::string_view> extra_end, bool explicit_parentheses,
                           bool with_namespace = false);
  ast::ExprPtr parse_expression(bool with_condexpr);
  ast::ExprPtr parse_condexpr();
  ast::ExprPtr parse_or();
  ast::ExprPtr parse_and();
  ast::ExprPtr parse_not();
  ast::ExprPtr parse_compare();
  ast::ExprPtr parse_math1();
  ast::ExprPtr parse_concat();
  ast::ExprPtr parse_math2();
  ast::ExprPtr parse_pow();
  ast::ExprPtr parse_unary(bool with_filter);
  ast::ExprPtr parse_primary(bool with_namespace);
  ast::ExprPtr parse_list();
  ast::ExprPtr parse_dict();
  ast::ExprPtr parse_postfix(ast::ExprPtr node);
  ast::ExprPtr parse_filter_expr(ast::ExprPtr node);
  ast::ExprPtr parse_subscript(ast::ExprPtr node);
  ast::ExprPtr parse_subscribed();
  ast::CallArgsExpr parse_call_args();
  ast::ExprPtr parse_call(ast::ExprPtr callee);
  std::string parse_dotted_name();
  bool soft() const { return !soft_.empty() && soft_.back(); }
  ast::ExprPtr parse_filter(ast::ExprPtr node, bool start_inline);
  ast::ExprPtr parse_test(ast::ExprPtr node);
  void note_name(const std::string& name);

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<bool> soft_;
  std::vector<std::string> tag_stack_;
  std::vector<std::set<std::string>> name_refs_;
};

}  // namespace pd::jinja::parsing
