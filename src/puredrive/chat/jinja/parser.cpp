#include "puredrive/chat/jinja/parser.h"

#include <algorithm>
#include <array>

#include "puredrive/chat/jinja/parser_internal.h"

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

}  // namespace

namespace parsing {

std::string Parser::describe(const Token& t) {
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

ast::Body Parser::subparse(std::initializer_list<std::string_view> end_tokens) {
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
ast::Body Parser::parse_statements(std::initializer_list<std::string_view> end_tokens, bool drop_needle) {
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

void Parser::parse_statement(ast::Body& out) {
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
    out.push_back(
        std::make_unique<ast::Unsupported>(loc(t), "'" + tag + "' (templates cannot load other templates)"));
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

ast::StmtPtr Parser::parse_for() {
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

ast::StmtPtr Parser::parse_if() {
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

ast::StmtPtr Parser::parse_set() {
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
void Parser::parse_signature(ast::MacroDef& def) {
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
void Parser::parse_macro_body(ast::MacroDef& def, std::string_view end_tag) {
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

ast::StmtPtr Parser::parse_macro() {
  const Token& t = next();
  auto def = std::make_unique<ast::MacroDef>(loc(t));
  def->name = expect_name().text;
  parse_signature(*def);
  parse_macro_body(*def, "endmacro");
  return def;
}

ast::StmtPtr Parser::parse_call_block() {
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

ast::StmtPtr Parser::parse_filter_block() {
  const Token& t = next();
  auto node = std::make_unique<ast::FilterBlock>(loc(t));
  node->filter = parse_filter(nullptr, true);
  node->body = parse_statements({"endfilter"}, true);
  return node;
}

ast::StmtPtr Parser::parse_with() {
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

ast::ExprPtr Parser::parse_assign_target(bool with_tuple, bool name_only,
                                         std::initializer_list<std::string_view> extra_end,
                                         bool with_namespace) {
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

void Parser::check_assignable(const ast::Expr& target) {
  if (target.kind == ast::ExprKind::kName) {
    const auto& name = static_cast<const ast::Name&>(target).name;
    if (name == "true" || name == "false" || name == "none" || name == "True" || name == "False" ||
        name == "None") {
      throw TemplateError(ErrorKind::kSyntax, "can't assign to 'const'", target.loc.line, target.loc.column);
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

}  // namespace parsing

bool is_known_filter(std::string_view name) {
  return std::find(kFilters.begin(), kFilters.end(), name) != kFilters.end();
}

bool is_known_test(std::string_view name) {
  return std::find(kTests.begin(), kTests.end(), name) != kTests.end();
}

std::unique_ptr<ast::Program> parse_template(std::string_view source) {
  return parsing::Parser(tokenize(source)).run();
}

}  // namespace pd::jinja
