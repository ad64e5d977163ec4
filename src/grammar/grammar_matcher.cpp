#include "grammar/grammar_matcher.h"

#include <algorithm>

#include "core/error.h"

namespace serval::grammar {

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), stepper_(*grammar_) {
  SERVAL_CHECK(grammar_ != nullptr, "GrammarMatcher needs a grammar");
  reset();
}

void GrammarMatcher::reset() {
  pool_ = StackPool();
  history_.clear();
  stepper_.start(pool_, a_);
  history_.push_back({a_.stacks, a_.reached_root});
}

bool GrammarMatcher::run(std::string_view bytes, State& out) {
  const State& cur = history_.back();
  if (bytes.empty()) {
    out = cur;
    return true;
  }
  StepResult* in = &a_;
  StepResult* next = &b_;
  in->stacks = cur.stacks;
  for (unsigned char c : bytes) {
    stepper_.step(pool_, in->stacks, c, *next);
    if (next->stacks.empty() && !next->reached_root) return false;
    std::swap(in, next);
  }
  out.stacks = in->stacks;
  out.can_end = in->reached_root;
  return true;
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  size_t mark = pool_.size();
  State next;
  if (!run(bytes, next)) {
    pool_.truncate(mark);
    return false;
  }
  history_.push_back(std::move(next));
  // Trimmed in batches, so that the erase costs O(1) per step on average.
  if (max_rollback_ != SIZE_MAX && history_.size() > 2 * max_rollback_ + 2)
    history_.erase(history_.begin(), history_.end() - ptrdiff_t(max_rollback_ + 1));
  maybe_compact();
  return true;
}

bool GrammarMatcher::can_accept_bytes(std::string_view bytes) {
  size_t mark = pool_.size();
  State next;
  bool ok = run(bytes, next);
  pool_.truncate(mark);
  return ok;
}

size_t GrammarMatcher::min_bytes_to_end() const {
  if (can_end()) return 0;
  size_t best = SIZE_MAX;
  for (uint32_t s : stacks()) {
    size_t total = 0;
    for (uint32_t n = s; n != kRootNode && total < best; n = pool_.node(n).parent)
      total += grammar_->min_bytes_to_end(pool_.node(n).pos);
    best = std::min(best, total);
  }
  return best;
}

void GrammarMatcher::rollback(size_t n) {
  SERVAL_CHECK(n <= num_steps(), "cannot roll back ", n, " steps: only ", num_steps(), " can be undone");
  history_.resize(history_.size() - n);
  // Nodes made by the undone steps stay until the next compaction.
}

void GrammarMatcher::maybe_compact() {
  if (pool_.size() < compact_at_) return;
  std::vector<std::vector<uint32_t>*> roots;
  for (auto& s : history_) roots.push_back(&s.stacks);
  pool_.compact(roots);
  compact_at_ = std::max<size_t>(size_t(1) << 16, pool_.size() * 4);
}

}  // namespace serval::grammar
