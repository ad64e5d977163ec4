#pragma once
// BatchBuilder: turns "these sequences, this many new tokens each" into the
// flat Batch a forward pass takes (runtime/batch.h). Used by the
// Engine loop.
#include <cstdint>
#include <span>

#include "runtime/batch.h"
#include "sched/scheduler.h"

namespace serval {

class BatchBuilder {
 public:
  // Throws serval::Error if block_size < 1.
  explicit BatchBuilder(int32_t block_size);

  // Fills `batch` (reusing its storage) for `items`, in their order. A sequence
  // gets a logits row (its last new token) when this step computes all of its
  // known tokens, i.e. a decode step or the last chunk of its prompt.
  // Throws serval::Error if an item has no new tokens, more than it has
  // uncomputed, or its block table lacks slots for them (allocate first).
  void build(std::span<const ScheduledChunk> items, Batch& batch) const;
  Batch build(std::span<const ScheduledChunk> items) const;
  // Fills `batch` for a Scheduler::continue_plan() plan: each item one token
  // at position seq->num_tokens(), whose id is the token sampled for row
  // plan.source_rows[i] of the step before (Batch::token_source), and a
  // logits row. Throws serval::Error if a table lacks the slot.
  void build_continuation(const StepPlan& plan, Batch& batch) const;

 private:
  // batch.block_table from the items' tables, rows of max_blocks.
  void fill_block_table(std::span<const ScheduledChunk> items, int32_t max_blocks, Batch& batch) const;
  int32_t block_size_;
};

}  // namespace serval
