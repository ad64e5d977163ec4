#pragma once
// CompiledGrammar: a Grammar lowered to bytes, checked and prepared for the
// matcher. Every rule becomes alternatives of element sequences; an element
// is a set of bytes or a reference to a rule. Literals become one byte set per
// byte, classes UTF-8 byte sequences (utf8_ranges.h), groups and repetitions
// generated rules (x* is `r ::= x r | ""`, x{0,n} a chain of n such rules).
//
// All elements live in one array and each alternative ends in an End element,
// so a parser position is a single index. For each position the compiler
// precomputes its expansion: the byte-set positions reachable from it without
// consuming input, each with the return positions pushed on the way; a call
// in tail position pushes nothing, so `x*` runs in constant stack depth.
//
// Compilation refuses (serval::Error) undefined rules, left recursion (a rule
// that can reach itself through a call before consuming input: its stacks
// would grow without end) and rules that can never finish matching.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "grammar/grammar.h"

namespace serval::grammar {

struct ByteSet {
  uint64_t w[4] = {0, 0, 0, 0};
  bool has(uint8_t b) const { return (w[b >> 6] >> (b & 63)) & 1; }
  void add(uint8_t b) { w[b >> 6] |= uint64_t(1) << (b & 63); }
  bool operator==(const ByteSet&) const = default;
};

class CompiledGrammar {
 public:
  enum class ElemKind : uint8_t { Bytes, Ref, End };
  struct Elem {
    ElemKind kind;
    uint32_t arg;  // Bytes: byte set index; Ref and End: rule index
  };
  // A byte-set position reachable from a position, and the return positions
  // pushed (bottom first) on the way there.
  struct Entry {
    uint32_t top;
    uint32_t chain_begin, chain_end;
  };

  // Throws serval::Error naming the problem (see above).
  static std::shared_ptr<const CompiledGrammar> compile(const Grammar& g);

  const Elem& elem(uint32_t pos) const { return elems_[pos]; }
  const ByteSet& byte_set(uint32_t pos) const { return sets_[elems_[pos].arg]; }
  std::span<const Entry> expansion(uint32_t pos) const {
    return {entries_.data() + exp_begin_[pos], entries_.data() + exp_begin_[pos + 1]};
  }
  std::span<const uint32_t> chain(const Entry& e) const {
    return {chains_.data() + e.chain_begin, chains_.data() + e.chain_end};
  }
  // True when the rule of `pos` can end from `pos` without consuming input.
  bool pops(uint32_t pos) const { return pops_[pos]; }
  // The fewest bytes from `pos` to the end of its alternative (a sampler's
  // guide towards finishing; saturates at UINT32_MAX).
  uint32_t min_bytes_to_end(uint32_t pos) const { return min_to_end_[pos]; }
  // The position of the start symbol (a call of root in a rule of its own).
  uint32_t start() const { return start_; }
  size_t num_positions() const { return elems_.size(); }
  size_t num_rules() const { return rule_names_.size(); }
  const std::string& rule_name(uint32_t rule) const { return rule_names_[rule]; }
  // "name ::= [a] • name2 [b]" for messages and debugging.
  std::string describe(uint32_t pos) const;

 private:
  friend class Lowering;
  std::vector<Elem> elems_;
  std::vector<ByteSet> sets_;
  std::vector<std::string> rule_names_;
  std::vector<std::vector<uint32_t>> alt_starts_;  // by rule
  std::vector<uint32_t> exp_begin_;                // by position, +1
  std::vector<Entry> entries_;
  std::vector<uint32_t> chains_;
  std::vector<uint8_t> pops_;
  std::vector<uint32_t> min_to_end_;
  uint32_t start_ = 0;
};

}  // namespace serval::grammar
