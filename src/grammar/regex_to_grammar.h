#pragma once
// Regular expressions as grammars: the subset that JSON Schema `pattern` and
// vLLM's `guided_regex` use. Literals and escapes (\d \w \s \D \W \S \. \n
// \t \xHH \uHHHH ...), classes [a-z] [^"], `.`, groups ( ) (?: ) (?<name> ),
// alternation, quantifiers ? * + {m} {m,} {m,n} (lazy forms too), and ^ / $
// at the ends (ignored: the whole text must match). Backreferences,
// lookaround, word boundaries, inline flags and Unicode properties are
// refused with an Error naming the construct.
//
// The text matched is always valid under both ECMAScript and Python `re`
// meanings: `.` leaves out line terminators, and \D \W \S stay in ASCII (a
// non-ASCII digit or letter would be a \d or \w to Python).
#include <string_view>

#include "grammar/grammar.h"

namespace serval::grammar {

// The pattern as an expression over characters (no rule references).
ExprPtr regex_to_expr(std::string_view pattern);
// A grammar whose root matches exactly the pattern.
Grammar regex_to_grammar(std::string_view pattern);

}  // namespace serval::grammar
