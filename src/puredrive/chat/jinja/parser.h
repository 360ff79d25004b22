// Recursive-descent parser from tokens to the syntax tree, following jinja2/parser.py (3.1): the same
// operator precedence (conditional < or < and < not < comparisons < + - < ~ < * / // % < ** < unary <
// postfix/filters/tests), statements (if/for/set/macro/call/filter/with/break/continue/generation) and
// the same compile-time checks (unknown filter or test outside an `if`).
#pragma once

#include <memory>
#include <string_view>

#include "puredrive/chat/jinja/ast.h"

namespace pd::jinja {

// Throws TemplateError (kSyntax) with line/column on malformed templates.
std::unique_ptr<ast::Program> parse_template(std::string_view source);

// Whether jinja2 (with transformers' additions) defines a filter / test of this name.
bool is_known_filter(std::string_view name);
bool is_known_test(std::string_view name);

}  // namespace pd::jinja
