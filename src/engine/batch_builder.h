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

 private:
  int32_t block_size_;
};

}  // namespace serval
