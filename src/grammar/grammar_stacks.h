#pragma once
// The parse stacks under GrammarMatcher and the token masks. A stack is a
// list of grammar positions: the top one is a byte-set position (what the
// next byte must match), the ones below are return positions. Stacks share
// their tails and are interned, so equal stacks have equal ids: a set of
// stacks deduplicates by id, and an ambiguous grammar cannot multiply states
// beyond the distinct stacks it really has.
#include <cstdint>
#include <span>
#include <vector>

#include "grammar/compiled_grammar.h"

namespace serval::grammar {

// Sentinel stack ids below every stack. Returning into kRootNode means the
// start symbol is complete (the text may end); into kBottomNode, that a walk
// over a stack's top frames alone left those frames (token_mask.cpp).
inline constexpr uint32_t kRootNode = 0;
inline constexpr uint32_t kBottomNode = 1;

struct StackNode {
  uint32_t pos;     // byte-set position on top; a return position below
  uint32_t parent;  // the stack below
};

class StackPool {
 public:
  StackPool();
  uint32_t intern(uint32_t pos, uint32_t parent);
  const StackNode& node(uint32_t id) const { return nodes_[id]; }
  size_t size() const { return nodes_.size(); }
  // Forgets the nodes made after size() was `mark` (scratch work of a mask).
  void truncate(size_t mark);
  // Keeps only the nodes reachable from `roots`, renumbering them; rewrites
  // each id in `roots` in place.
  void compact(std::span<std::vector<uint32_t>*> roots);

 private:
  size_t slot_of(uint32_t pos, uint32_t parent) const;
  void rehash(size_t capacity);

  std::vector<StackNode> nodes_;
  std::vector<uint32_t> table_;  // open addressing over node ids; kEmpty = free
};

// The stacks after one byte, and whether a stack returned into a sentinel.
struct StepResult {
  std::vector<uint32_t> stacks;  // sorted, unique
  bool reached_root = false;
  bool reached_bottom = false;
  void clear() {
    stacks.clear();
    reached_root = reached_bottom = false;
  }
};

// Closes stacks over calls and returns; one instance is reused to keep its
// scratch vectors.
class Stepper {
 public:
  explicit Stepper(const CompiledGrammar& g, size_t max_stacks = 100000) : g_(&g), max_stacks_(max_stacks) {}
  // The stacks that reach each byte-set position from `pos` over `parent`.
  void advance(StackPool& pool, uint32_t pos, uint32_t parent, StepResult& out);
  // Returns into stack `node` (its top is a return position).
  void pop_into(StackPool& pool, uint32_t node, StepResult& out);
  // Consumes byte b from every stack of `in` (out may not alias in).
  void step(StackPool& pool, std::span<const uint32_t> in, uint8_t b, StepResult& out);
  // The stacks at the start of the text.
  void start(StackPool& pool, StepResult& out);
  // The stacks after returning into stack `node` with nothing consumed.
  void resume(StackPool& pool, uint32_t node, StepResult& out);
  // Sorts and deduplicates out.stacks; refuses a runaway number of stacks.
  void finish(StepResult& out);

 private:
  const CompiledGrammar* g_;
  size_t max_stacks_;
  std::vector<uint32_t> popped_;  // nodes returned into during this step
};

}  // namespace serval::grammar
