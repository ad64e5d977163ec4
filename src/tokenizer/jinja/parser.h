#pragma once
// Jinja parser: tokens -> statements and expressions, with jinja2's operator
// precedence (conditional < or < and < not < comparison < + - < ~ < * / // %
// < ** < unary, then postfix . [] () and | filters / is tests).
#include <string>

#include "tokenizer/jinja/ast.h"

namespace serval::jinja {

// Parses a whole template. Throws serval::Error "chat template syntax error at
// line L, column C: ..." on malformed input or an unsupported tag.
Body parse_template(const std::string& source);

}  // namespace serval::jinja
