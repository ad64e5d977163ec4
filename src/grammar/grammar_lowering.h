#pragma once
// The first step of CompiledGrammar::compile: expression trees to flat rules
// of byte sets and rule references (literals per byte, classes as UTF-8
// sequences, groups and repetitions as generated rules, shared when equal).
#include <string>
#include <vector>

#include "grammar/compiled_grammar.h"

namespace serval::grammar {

struct FlatRule {
  std::string name;
  std::vector<std::vector<CompiledGrammar::Elem>> alts;  // without End elements
};

struct FlatGrammar {
  std::vector<FlatRule> rules;
  std::vector<ByteSet> sets;
  uint32_t root = 0;
};

// Throws serval::Error for undefined rules or a grammar too large to compile.
FlatGrammar lower_grammar(const Grammar& g);

}  // namespace serval::grammar
