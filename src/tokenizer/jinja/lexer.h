#pragma once
// Jinja lexer: splits a template into text and the tokens inside {{ }} and
// {% %} tags, applying whitespace control the way jinja2 does with
// trim_blocks=True and lstrip_blocks=True ({%- -%} {{- -}} strip all
// whitespace; a block tag alone on its line takes its indentation and newline
// with it). Comments vanish; {% raw %} bodies become text.
#include <string>
#include <vector>

namespace serval::jinja {

enum class TokenKind { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Integer, Float, Operator, Eof };

struct Token {
  TokenKind kind;
  std::string text;  // text, name, operator, or the decoded string literal / number spelling
  int line = 1;
  int column = 1;
};

// Throws serval::Error naming line and column on an unterminated tag or
// string, or a character that starts no token.
std::vector<Token> tokenize(const std::string& source);

// "line L, column C" for error messages.
std::string where(int line, int column);

}  // namespace serval::jinja
