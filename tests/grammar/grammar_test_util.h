#pragma once
// Helpers for the grammar tests: compile GBNF text, match whole strings.
#include <memory>
#include <string>
#include <string_view>

#include "grammar/compiled_grammar.h"
#include "grammar/ebnf_parser.h"
#include "grammar/grammar_matcher.h"

namespace serval::grammar::testing {

inline std::shared_ptr<const CompiledGrammar> compile_gbnf(std::string_view text) {
  return CompiledGrammar::compile(parse_gbnf(text));
}

// Whether `text` is a complete match of the grammar.
inline bool matches(const std::shared_ptr<const CompiledGrammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.accept_bytes(text) && m.can_end();
}

// Whether `text` is a prefix of some match.
inline bool is_prefix(const std::shared_ptr<const CompiledGrammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.accept_bytes(text);
}

}  // namespace serval::grammar::testing
