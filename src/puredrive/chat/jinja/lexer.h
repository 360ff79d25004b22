// Tokenizer for Jinja2 templates, configured as transformers configures it for chat templates:
// trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False, default delimiters. Mirrors
// jinja2/lexer.py (3.1): the same whitespace-control rules ({%- -%}, {%+ +%}, lstrip of block and
// comment tags only at line starts), the same newline normalisation, Python string-literal escapes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pd::jinja {

enum class TokenType : uint8_t {
  kData,        // template text
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,
  kInteger,
  kFloat,
  kOperator,
  kEof,
};

enum class Op : uint8_t {
  kNone,
  kAdd,
  kSub,
  kMul,
  kDiv,
  kFloorDiv,
  kMod,
  kPow,
  kTilde,
  kLBracket,
  kRBracket,
  kLParen,
  kRParen,
  kLBrace,
  kRBrace,
  kEq,
  kNe,
  kGt,
  kGtEq,
  kLt,
  kLtEq,
  kAssign,
  kDot,
  kColon,
  kPipe,
  kComma,
  kSemicolon,
};

const char* op_text(Op op);

struct Token {
  TokenType type = TokenType::kEof;
  Op op = Op::kNone;
  std::string text;  // data, name, or decoded string literal
  int64_t int_value = 0;
  double float_value = 0.0;
  int line = 1;
  int column = 1;
};

// Tokenizes the whole template; throws TemplateError (kSyntax) with line/column on malformed input.
std::vector<Token> tokenize(std::string_view source);

}  // namespace pd::jinja
