#pragma once
// Jinja expressions with jinja2's precedence: conditional < or < and < not <
// comparison < + - < ~ < * / // % < ** < unary, then postfix . [] () and
// | filters / is tests.
#include <vector>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/lexer.h"

namespace serval::jinja {

// Parses one expression starting at toks[pos] and advances pos past it.
// with_condexpr: allow `a if b else c` at the top; tuple: allow `a, b`.
ExprPtr parse_expression_at(const std::vector<Token>& toks, size_t& pos, bool with_condexpr, bool tuple);

}  // namespace serval::jinja
