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

  // Fills `batch` (reusing its storage) for `items`, in their order: each
  // item's tokens from its start, a fed item's token from the step before
  // (Batch::token_source). A sequence gets a logits row (its last new token)
  // when the item is fed or computes all of its known tokens, i.e. a decode
  // step or the last chunk of its prompt. Throws serval::Error if an item has
  // no new tokens, starts before its computed tokens, goes past its known
  // ones, or its block table lacks slots for them (allocate first).
  void build(std::span<const ScheduledChunk> items, Batch& batch) const;
  Batch build(std::span<const ScheduledChunk> items) const;

 private:
  // batch.block_table from the items' tables, rows of max_blocks.
  void fill_block_table(std::span<const ScheduledChunk> items, int32_t max_blocks, Batch& batch) const;
  int32_t block_size_;
};

}  // namespace serval
