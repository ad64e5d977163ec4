#pragma once
// GBNF, the EBNF dialect of llama.cpp that vLLM's `guided_grammar` passes on
// to xgrammar:
//
//   root   ::= "{" ws pair ("," ws pair)* "}"     # comments run to the line end
//   pair   ::= [a-z]+ ":" [0-9]{1,3} | "\u00e9"? "x"
//
// Literals "..." and classes [...] / [^...] take \n \r \t \\ \" \] \xNN
// \uNNNN \UNNNNNNNN escapes (code points, written as UTF-8); `.` is any
// character; postfix ? * + {m} {m,} {m,n} {,n}; ( ) groups. A rule runs until
// the next `name ::=`, so alternatives may continue on following lines.
// Errors name the line and column.
#include <string_view>

#include "grammar/grammar.h"

namespace serval::grammar {

// Parses GBNF text; every referenced rule must be defined, and `root` too.
Grammar parse_gbnf(std::string_view text);

}  // namespace serval::grammar
