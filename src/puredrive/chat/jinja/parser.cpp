#include "puredrive/chat/jinja/parser.h"

#include <algorithm>
#include <array>
#include <initializer_list>
#include <set>

#include "puredrive/chat/jinja/error.h"
#include "puredrive/chat/jinja/lexer.h"

namespace pd::jinja {

namespace {

constexpr std::array<std::string_view, 54> kFilters = {
    "abs",    "attr",       "batch",       "capitalize", "center",   "count",
    "d",      "default",    "dictsort",    "e",          "escape",   "filesizeformat",
    "first",  "float",      "forceescape", "format",     "groupby",  "indent",
    "int",    "items",      "join",        "last",       "length",   "list",
    "lower",  "map",        "max",         "min",        "pprint",   "random",
    "reject", "rejectattr", "replace",     "reverse",    "round",    "safe",
    "select", "selectattr", "slice",       "sort",       "string",   "striptags",
    "sum",    "title",      "tojson",      "trim",       "truncate", "unique",
    "upper",  "urlencode",  "urlize",      "wordcount",  "wordwrap", "xmlattr"};

constexpr std::array<std::string_view, 39> kTests = {
    "!=",       "<",           "<=",          "==",      ">",       ">=",        "boolean",  "callable",
    "defined",  "divisibleby", "eq",          "equalto", "escaped", "even",      "false",    "filter",
    "float",    "ge",          "greaterthan", "gt",      "in",      "integer",   "iterable", "le",
    "lessthan", "lower",       "lt",          "mapping", "ne",      "none",      "number",   "odd",
    "sameas",   "sequence",    "string",      "test",    "true",    "undefined", "upper"};

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

  static std::string describe(const Token& t) {
    switch (t.type) {
      case TokenType::kData:
        return "template data";
      case TokenType::kVarBegin:
        return "begin of print statement";
      case TokenType::kVarEnd:
        return "end of print statement";
      case TokenType::kBlockBegin:
        return "begin of statement block";
      case TokenType::kBlockEnd:
        return "end of statement block";
      case TokenType::kName:
        return t.text;
      case TokenType::kString:
        return "string";
      case TokenType::kInteger:
        return "integer";
      case TokenType::kFloat:
        return "float";
      case TokenType::kOperator:
        return op_text(t.op);
      case TokenType::kEof:
        return "end of template";
    }
    return "token";
  }

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

  // ---- statements ----

  ast::Body subparse(std::initializer_list<std::string_view> end_tokens) {
    DepthGuard guard(*this);
    ast::Body body;
    for (;;) {
      const Token& t = cur();
      switch (t.type) {
        case TokenType::kData:
          body.push_back(std::make_unique<ast::Text>(loc(t), t.text));
          next();
          break;
        case TokenType::kVarBegin: {
          next();
          auto expr = parse_tuple(false, true, {}, false);
          body.push_back(std::make_unique<ast::Print>(expr->loc, std::move(expr)));
          expect(TokenType::kVarEnd, "end of print statement");
          break;
        }
        case TokenType::kBlockBegin: {
          next();
          if (cur().type == TokenType::kName &&
              std::find(end_tokens.begin(), end_tokens.end(), cur().text) != end_tokens.end()) {
            return body;
          }
          parse_statement(body);
          expect(TokenType::kBlockEnd, "end of statement block");
          break;
        }
        case TokenType::kEof:
          return body;
        default:
          fail_here("unexpected token");
      }
    }
  }

  // parse_statements of jinja2: optional ':', block end, body until one of end_tokens.
  ast::Body parse_statements(std::initializer_list<std::string_view> end_tokens, bool drop_needle) {
    skip_op(Op::kColon);
    expect(TokenType::kBlockEnd, "end of statement block");
    ast::Body body = subparse(end_tokens);
    if (cur().type == TokenType::kEof) {
      std::string expected;
      for (auto e : end_tokens) expected += (expected.empty() ? "'" : " or '") + std::string(e) + "'";
      fail_at(cur(),
              fmt::format("Unexpected end of template. Jinja was looking for the following tags: {}. The "
                          "innermost block that needs to be closed is '{}'.",
                          expected, tag_stack_.empty() ? "" : tag_stack_.back()));
    }
    if (drop_needle) next();
    return body;
  }

  void parse_statement(ast::Body& out) {
    if (cur().type != TokenType::kName) fail_here("tag name expected");
    const Token& t = cur();
    const std::string tag = t.text;
    tag_stack_.push_back(tag);
    if (tag == "for") {
      out.push_back(parse_for());
    } else if (tag == "if") {
      out.push_back(parse_if());
    } else if (tag == "set") {
      out.push_back(parse_set());
    } else if (tag == "macro") {
      out.push_back(parse_macro());
    } else if (tag == "call") {
      out.push_back(parse_call_block());
    } else if (tag == "filter") {
      out.push_back(parse_filter_block());
    } else if (tag == "with") {
      out.push_back(parse_with());
    } else if (tag == "print") {
      next();
      bool first = true;
      while (cur().type != TokenType::kBlockEnd) {
        if (!first) expect_op(Op::kComma);
        first = false;
        auto expr = parse_expression(true);
        out.push_back(std::make_unique<ast::Print>(expr->loc, std::move(expr)));
      }
    } else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail_at(t, fmt::format("'{}' outside of a loop", tag));
      next();
      out.push_back(std::make_unique<ast::Stmt>(
          tag == "break" ? ast::StmtKind::kBreak : ast::StmtKind::kContinue, loc(t)));
    } else if (tag == "generation") {
      // transformers' AssistantTracker extension: {% generation %}...{% endgeneration %} renders its body.
      next();
      auto node = std::make_unique<ast::ScopedBody>(loc(t));
      node->body = parse_statements({"endgeneration"}, true);
      out.push_back(std::move(node));
    } else if (tag == "block") {
      next();
      const std::string name = expect_name().text;
      skip_name("scoped");
      skip_name("required");
      auto node = std::make_unique<ast::ScopedBody>(loc(t));
      node->body = parse_statements({"endblock"}, true);
      skip_name(name);
      out.push_back(std::move(node));
    } else if (tag == "autoescape") {
      next();
      auto value = parse_expression(true);
      auto node = std::make_unique<ast::ScopedBody>(loc(t));
      node->body = parse_statements({"endautoescape"}, true);
      if (!(value->kind == ast::ExprKind::kConst && !static_cast<ast::Const&>(*value).value.truthy())) {
        out.push_back(std::make_unique<ast::Unsupported>(loc(t), "autoescape blocks"));
      }
      out.push_back(std::move(node));
    } else if (tag == "include" || tag == "import" || tag == "from" || tag == "extends") {
      // No loader exists for chat templates; jinja2 fails at render time, so do we. Skip the arguments.
      next();
      while (cur().type != TokenType::kBlockEnd && cur().type != TokenType::kEof) next();
      out.push_back(std::make_unique<ast::Unsupported>(
          loc(t), "'" + tag + "' (templates cannot load other templates)"));
    } else {
      std::string message = fmt::format("Encountered unknown tag '{}'.", tag);
      tag_stack_.pop_back();
      if (!tag_stack_.empty()) {
        message += fmt::format(" The innermost block that needs to be closed is '{}'.", tag_stack_.back());
      }
      fail_at(t, message);
    }
    tag_stack_.pop_back();
  }

  ast::StmtPtr parse_for() {
    const Token& t = next();
    auto node = std::make_unique<ast::For>(loc(t));
    node->target = parse_assign_target(true, false, {"in"}, false);
    expect_name("in");
    node->iter = parse_tuple(false, false, {"recursive"}, false);
    soft_.push_back(false);
    ++loop_depth_;
    if (skip_name("if")) node->filter = parse_expression(true);
    node->recursive = skip_name("recursive");
    node->body = parse_statements({"endfor", "else"}, false);
    --loop_depth_;
    if (next().text != "endfor") node->else_body = parse_statements({"endfor"}, true);
    soft_.pop_back();
    return node;
  }

  ast::StmtPtr parse_if() {
    const Token& t = next();
    auto node = std::make_unique<ast::If>(loc(t));
    soft_.push_back(true);
    for (;;) {
      auto test = parse_tuple(false, false, {}, false);
      auto body = parse_statements({"elif", "else", "endif"}, false);
      node->branches.emplace_back(std::move(test), std::move(body));
      const Token& end = next();
      if (end.text == "elif") continue;
      if (end.text == "else") node->else_body = parse_statements({"endif"}, true);
      break;
    }
    soft_.pop_back();
    return node;
  }

  ast::StmtPtr parse_set() {
    const Token& t = next();
    auto target = parse_assign_target(true, false, {}, true);
    if (skip_op(Op::kAssign)) {
      auto value = parse_tuple(false, true, {}, false);
      return std::make_unique<ast::Assign>(loc(t), std::move(target), std::move(value));
    }
    auto node = std::make_unique<ast::AssignBlock>(loc(t));
    node->target = std::move(target);
    if (is_op(Op::kPipe)) node->filter = parse_filter(nullptr, false);
    node->body = parse_statements({"endset"}, true);
    return node;
  }

  // Parameters of a macro or call block: (a, b=1, ...)
  void parse_signature(ast::MacroDef& def) {
    expect_op(Op::kLParen);
    while (!is_op(Op::kRParen)) {
      if (!def.params.empty()) expect_op(Op::kComma);
      def.params.push_back(expect_name().text);
      if (skip_op(Op::kAssign)) {
        def.defaults.push_back(parse_expression(true));
      } else if (!def.defaults.empty()) {
        fail_here("non-default argument follows default argument");
      }
    }
    expect_op(Op::kRParen);
  }

  // Macro bodies: record whether they reference caller / varargs / kwargs (jinja2 decides the
  // macro's accepted arguments from that).
  void parse_macro_body(ast::MacroDef& def, std::string_view end_tag) {
    name_refs_.emplace_back();
    soft_.push_back(false);
    const int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    def.body = parse_statements({end_tag}, true);
    loop_depth_ = saved_loop_depth;
    soft_.pop_back();
    const auto& refs = name_refs_.back();
    def.uses_caller = refs.count("caller") > 0;
    def.uses_varargs = refs.count("varargs") > 0;
    def.uses_kwargs = refs.count("kwargs") > 0;
    auto inner = std::move(name_refs_.back());
    name_refs_.pop_back();
    if (!name_refs_.empty()) name_refs_.back().insert(inner.begin(), inner.end());
  }

  ast::StmtPtr parse_macro() {
    const Token& t = next();
    auto def = std::make_unique<ast::MacroDef>(loc(t));
    def->name = expect_name().text;
    parse_signature(*def);
    parse_macro_body(*def, "endmacro");
    return def;
  }

  ast::StmtPtr parse_call_block() {
    const Token& t = next();
    auto node = std::make_unique<ast::CallBlock>(loc(t));
    node->caller = std::make_shared<ast::MacroDef>(loc(t));
    node->caller->name = "caller";
    if (is_op(Op::kLParen)) parse_signature(*node->caller);
    node->call = parse_expression(true);
    if (node->call->kind != ast::ExprKind::kCall) fail_at(t, "expected call");
    parse_macro_body(*node->caller, "endcall");
    return node;
  }

  ast::StmtPtr parse_filter_block() {
    const Token& t = next();
    auto node = std::make_unique<ast::FilterBlock>(loc(t));
    node->filter = parse_filter(nullptr, true);
    node->body = parse_statements({"endfilter"}, true);
    return node;
  }

  ast::StmtPtr parse_with() {
    const Token& t = next();
    auto node = std::make_unique<ast::With>(loc(t));
    while (cur().type != TokenType::kBlockEnd) {
      if (!node->assignments.empty()) expect_op(Op::kComma);
      auto target = parse_assign_target(true, false, {}, false);
      expect_op(Op::kAssign);
      node->assignments.emplace_back(std::move(target), parse_expression(true));
    }
    soft_.push_back(false);
    node->body = parse_statements({"endwith"}, true);
    soft_.pop_back();
    return node;
  }

  ast::ExprPtr parse_assign_target(bool with_tuple, bool name_only,
                                   std::initializer_list<std::string_view> extra_end, bool with_namespace) {
    ast::ExprPtr target;
    if (name_only) {
      const Token& t = expect_name();
      return std::make_unique<ast::Name>(loc(t), t.text);
    }
    if (with_tuple) {
      target = parse_tuple(true, true, extra_end, false, with_namespace);
    } else {
      target = parse_primary(with_namespace);
    }
    check_assignable(*target);
    return target;
  }

  void check_assignable(const ast::Expr& target) {
    if (target.kind == ast::ExprKind::kName) {
      const auto& name = static_cast<const ast::Name&>(target).name;
      if (name == "true" || name == "false" || name == "none" || name == "True" || name == "False" ||
          name == "None") {
        throw TemplateError(ErrorKind::kSyntax, "can't assign to 'const'", target.loc.line,
                            target.loc.column);
      }
      return;
    }
    if (target.kind == ast::ExprKind::kNsRef) return;
    if (target.kind == ast::ExprKind::kTuple) {
      for (const auto& item : static_cast<const ast::Sequence&>(target).items) check_assignable(*item);
      return;
    }
    const char* what = target.kind == ast::ExprKind::kConst ? "const" : "expression";
    throw TemplateError(ErrorKind::kSyntax, fmt::format("can't assign to '{}'", what), target.loc.line,
                        target.loc.column);
  }

  // ---- expressions ----

  bool is_tuple_end(std::initializer_list<std::string_view> extra_end) const {
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

  ast::ExprPtr parse_tuple(bool simplified, bool with_condexpr,
                           std::initializer_list<std::string_view> extra_end, bool explicit_parentheses,
                           bool with_namespace = false) {
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

  ast::ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ast::ExprPtr parse_condexpr() {
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

  ast::ExprPtr parse_or() {
    auto left = parse_and();
    while (is_name("or")) {
      const ast::Location l = here();
      next();
      left = std::make_unique<ast::Logical>(ast::ExprKind::kOr, l, std::move(left), parse_and());
    }
    return left;
  }

  ast::ExprPtr parse_and() {
    auto left = parse_not();
    while (is_name("and")) {
      const ast::Location l = here();
      next();
      left = std::make_unique<ast::Logical>(ast::ExprKind::kAnd, l, std::move(left), parse_not());
    }
    return left;
  }

  ast::ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      const ast::Location l = here();
      next();
      return std::make_unique<ast::Unary>(l, ast::UnaryOp::kNot, parse_not());
    }
    return parse_compare();
  }

  ast::ExprPtr parse_compare() {
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

  ast::ExprPtr parse_math1() {
    auto left = parse_concat();
    while (is_op(Op::kAdd) || is_op(Op::kSub)) {
      const ast::Location l = here();
      const auto op = next().op == Op::kAdd ? ast::BinaryOp::kAdd : ast::BinaryOp::kSub;
      left = std::make_unique<ast::Binary>(l, op, std::move(left), parse_concat());
    }
    return left;
  }

  ast::ExprPtr parse_concat() {
    const ast::Location l = here();
    auto first = parse_math2();
    if (!is_op(Op::kTilde)) return first;
    auto node = std::make_unique<ast::Concat>(l);
    node->parts.push_back(std::move(first));
    while (skip_op(Op::kTilde)) node->parts.push_back(parse_math2());
    return node;
  }

  ast::ExprPtr parse_math2() {
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

  ast::ExprPtr parse_pow() {
    auto left = parse_unary(true);
    while (is_op(Op::kPow)) {
      const ast::Location l = here();
      next();
      left = std::make_unique<ast::Binary>(l, ast::BinaryOp::kPow, std::move(left), parse_unary(true));
    }
    return left;
  }

  ast::ExprPtr parse_unary(bool with_filter) {
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

  ast::ExprPtr parse_primary(bool with_namespace) {
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

  ast::ExprPtr parse_list() {
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

  ast::ExprPtr parse_dict() {
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

  ast::ExprPtr parse_postfix(ast::ExprPtr node) {
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

  ast::ExprPtr parse_filter_expr(ast::ExprPtr node) {
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

  ast::ExprPtr parse_subscript(ast::ExprPtr node) {
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

  ast::ExprPtr parse_subscribed() {
    const ast::Location l = here();
    auto slice = std::make_unique<ast::Slice>(l);
    if (skip_op(Op::kColon)) {
      // [:...]
    } else {
      auto node = parse_expression(true);
      if (!skip_op(Op::kColon)) return node;
      slice->start = std::move(node);
    }
    if (!is_op(Op::kColon) && !is_op(Op::kRBracket) && !is_op(Op::kComma))
      slice->stop = parse_expression(true);
    if (skip_op(Op::kColon)) {
      if (!is_op(Op::kRBracket) && !is_op(Op::kComma)) slice->step = parse_expression(true);
    }
    return slice;
  }

  ast::CallArgsExpr parse_call_args() {
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

  ast::ExprPtr parse_call(ast::ExprPtr callee) {
    // Errors of a call point at the callee (raise_exception(...) at its name).
    const ast::Location l = callee->loc;
    auto node = std::make_unique<ast::Call>(l, std::move(callee));
    node->args = parse_call_args();
    return node;
  }

  std::string parse_dotted_name() {
    std::string name = expect_name().text;
    while (skip_op(Op::kDot)) name += "." + expect_name().text;
    return name;
  }

  bool soft() const { return !soft_.empty() && soft_.back(); }

  ast::ExprPtr parse_filter(ast::ExprPtr node, bool start_inline) {
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

  ast::ExprPtr parse_test(ast::ExprPtr node) {
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

  void note_name(const std::string& name) {
    if (!name_refs_.empty()) name_refs_.back().insert(name);
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<bool> soft_;
  std::vector<std::string> tag_stack_;
  std::vector<std::set<std::string>> name_refs_;
};

}  // namespace

bool is_known_filter(std::string_view name) {
  return std::find(kFilters.begin(), kFilters.end(), name) != kFilters.end();
}

bool is_known_test(std::string_view name) {
  return std::find(kTests.begin(), kTests.end(), name) != kTests.end();
}

std::unique_ptr<ast::Program> parse_template(std::string_view source) {
  return Parser(tokenize(source)).run();
}

}  // namespace pd::jinja
