#pragma once
// GrammarMatcher: recognizes a growing text, byte by byte, against a
// CompiledGrammar. Its state is a set of parse stacks (grammar_stacks.h): a
// pushdown recognizer that follows every alternative at once, so it needs no
// lookahead and accepts any grammar without left recursion. Each
// accept_bytes() call (one token, in decoding) is all or nothing and can be
// undone with rollback(), as speculative decoding needs.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "grammar/compiled_grammar.h"
#include "grammar/grammar_stacks.h"

namespace serval::grammar {

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Consumes `bytes` if the text so far followed by them is a prefix of some
  // text of the grammar: then returns true and records one step for
  // rollback(). Otherwise returns false and changes nothing.
  bool accept_bytes(std::string_view bytes);
  // Whether `bytes` would be accepted, without consuming them.
  bool can_accept_bytes(std::string_view bytes);
  // The text so far is a complete match.
  bool can_end() const { return history_.back().can_end; }
  // No byte can follow the text so far (it is complete, or the grammar
  // matches nothing more).
  bool is_terminated() const { return history_.back().stacks.empty(); }
  // Neither can a byte follow nor can the text end. accept_bytes is all or
  // nothing and compiled grammars have no dead ends, so this stays false; it
  // is the invariant callers may check.
  bool is_dead() const { return is_terminated() && !can_end(); }

  // The fewest bytes that would complete the text (0 when can_end()): a
  // guide for samplers that must finish within a budget.
  size_t min_bytes_to_end() const;

  // Undoes the last n successful accept_bytes calls (n <= num_steps()).
  void rollback(size_t n);
  // Steps that rollback() can still undo.
  size_t num_steps() const { return history_.size() - 1; }
  // Keeps at least the last n steps undoable and lets older ones go, so a long
  // generation holds bounded history (speculative decoding needs its draft
  // length). Unlimited by default.
  void set_max_rollback(size_t n) { max_rollback_ = n; }
  void reset();

  const CompiledGrammar& grammar() const { return *grammar_; }
  const std::shared_ptr<const CompiledGrammar>& grammar_ptr() const { return grammar_; }

  // For the token masks: the current stacks and the pool they live in. Work
  // on the pool must truncate() back to its size before returning.
  std::span<const uint32_t> stacks() const { return history_.back().stacks; }
  StackPool& pool() { return pool_; }

 private:
  struct State {
    std::vector<uint32_t> stacks;
    bool can_end = false;
  };
  bool run(std::string_view bytes, State& out);
  void maybe_compact();

  std::shared_ptr<const CompiledGrammar> grammar_;
  StackPool pool_;
  Stepper stepper_;
  std::vector<State> history_;  // [0] is the start; back() is the current state
  StepResult a_, b_;            // scratch
  size_t compact_at_ = 1 << 16;
  size_t max_rollback_ = SIZE_MAX;
};

}  // namespace serval::grammar
