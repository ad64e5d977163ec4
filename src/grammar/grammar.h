#pragma once
// Grammar: the representation every front end (GBNF text, regular expressions,
// JSON Schema) produces and CompiledGrammar lowers to bytes. A grammar is a
// list of named rules, each an expression tree over literals, character
// classes (Unicode code points, matched as UTF-8), rule references, sequences,
// alternatives and bounded or unbounded repetition. The rule named `root`
// (Grammar::root) is the start symbol.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace serval::grammar {

// A closed range of Unicode code points.
struct CodepointRange {
  uint32_t lo = 0, hi = 0;
  bool operator==(const CodepointRange&) const = default;
};

inline constexpr uint32_t kMaxCodepoint = 0x10FFFF;
inline constexpr uint32_t kUnbounded = UINT32_MAX;  // Repeat::max for `*` and `+`

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

struct Expr {
  enum class Kind { Empty, Literal, Class, RuleRef, Seq, Alt, Repeat };
  Kind kind = Kind::Empty;
  std::string text;                    // Literal: UTF-8 bytes; RuleRef: rule name
  std::vector<CodepointRange> ranges;  // Class: sorted, disjoint, merged
  bool negated = false;                // Class: matches code points NOT in ranges
  std::vector<ExprPtr> items;          // Seq, Alt; Repeat: items[0]
  uint32_t min = 0, max = 0;           // Repeat bounds (max may be kUnbounded)
};

// Builders. They simplify on the way (a one-item sequence is the item, an
// empty literal is Empty) so front ends can compose freely.
ExprPtr empty();
ExprPtr lit(std::string_view utf8);
// A class over code point ranges; ranges are sorted and merged here.
ExprPtr cls(std::vector<CodepointRange> ranges, bool negated = false);
ExprPtr rule_ref(std::string_view rule);
ExprPtr seq(std::vector<ExprPtr> items);
ExprPtr alt(std::vector<ExprPtr> items);
ExprPtr repeat(ExprPtr item, uint32_t min, uint32_t max);
inline ExprPtr opt(ExprPtr e) { return repeat(std::move(e), 0, 1); }
inline ExprPtr star(ExprPtr e) { return repeat(std::move(e), 0, kUnbounded); }
inline ExprPtr plus(ExprPtr e) { return repeat(std::move(e), 1, kUnbounded); }

// Sorts and merges overlapping or adjacent ranges.
std::vector<CodepointRange> normalize_ranges(std::vector<CodepointRange> ranges);
// The code points (valid scalar values: surrogates excluded) not in `ranges`.
std::vector<CodepointRange> complement_ranges(const std::vector<CodepointRange>& ranges);

struct Grammar {
  std::vector<std::pair<std::string, ExprPtr>> rules;  // in definition order
  std::string root = "root";

  // Adds or replaces a rule.
  void set(const std::string& name, ExprPtr body);
  const Expr* find(std::string_view name) const;
};

// Prints the grammar as GBNF text that parse_gbnf() reads back to an equal grammar.
std::string to_gbnf(const Grammar& g);
std::string to_gbnf(const Expr& e);

// Structural equality (used by tests and to share identical generated rules).
bool equal(const Expr& a, const Expr& b);

}  // namespace serval::grammar
