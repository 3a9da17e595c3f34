// The Jinja lexer: splits template source into text and tag tokens with
// Hugging Face's whitespace settings (trim_blocks, lstrip_blocks, `-`/`+`
// markers, newlines normalized to "\n", one trailing newline dropped).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::jinja {

enum class TokenType {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOperator,
  kEnd
};

struct Token {
  TokenType type;
  std::string text;  // text, name, decoded string literal or operator
  int line = 1;
  int64_t int_value = 0;
  double float_value = 0;
};

// A syntax error in the template; caught by Template::parse.
struct SyntaxFailure : std::runtime_error {
  SyntaxFailure(std::string message, int at_line, bool over_limit = false)
      : std::runtime_error(std::move(message)), line(at_line), limit(over_limit) {}
  int line;
  bool limit;  // a bound of Limits was reached
};

// Tokenizes `source`; throws SyntaxFailure (unterminated tags, strings,
// unexpected characters). The result always ends with a kEnd token.
std::vector<Token> tokenize(std::string_view source);

}  // namespace tandem::jinja
