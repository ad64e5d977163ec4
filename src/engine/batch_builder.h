#pragma once
// BatchBuilder: turns "these sequences, this many new tokens each" into the
// flat Batch a forward pass takes (runtime/batch.h). Used by the
// Engine loop.
#include <cstdint>
#include <span>

#include "runtime/batch.h"
#include "sched/scheduler.h"

namespace serval {

// Which of a step's logits rows serve what: `sampled[i]`, the row of the
// i-th item that samples (StepPlan::sample_rows' order; with a draft of d
// tokens, the first of its 1 + d consecutive rows); `scored`, runs of
// rows scoring prompt tokens (Sequence::scores_prompt): the row of prompt
// position p holds the logits of the token at p + 1.
struct StepRows {
  struct Scored {
    size_t item = 0;             // index into the items
    int32_t first_row = 0;       // index into Batch::logits_rows
    int64_t first_position = 0;  // prompt position of that row
    int32_t count = 0;
  };
  std::vector<int32_t> sampled;
  std::vector<Scored> scored;
};

class BatchBuilder {
 public:
  // Throws serval::Error if block_size < 1.
  explicit BatchBuilder(int32_t block_size);

  // Fills `batch` (reusing its storage) for `items`, in their order: each
  // item's tokens from its start, a fed item's token from the step before
  // (Batch::token_source). A sequence gets a logits row (its last new token)
  // when the item is fed or computes all of its known tokens, i.e. a decode
  // step or the last chunk of its prompt; a prompt being scored gets a row
  // for each of its new tokens but the prompt's last (`rows`, when given,
  // says which is which). A sequence with draft tokens (Sequence::draft_ids)
  // computes its last known token and the draft, with a row for each
  // (`rows->sampled` names the first). Throws serval::Error if an item has
  // no new tokens, starts before its computed tokens, goes past its known
  // ones, or its block table lacks slots for them (allocate first).
  void build(std::span<const ScheduledChunk> items, Batch& batch, StepRows* rows = nullptr) const;
  Batch build(std::span<const ScheduledChunk> items) const;

 private:
  // batch.block_table from the items' tables, rows of max_blocks.
  void fill_block_table(std::span<const ScheduledChunk> items, int32_t max_blocks, Batch& batch) const;
  int32_t block_size_;
};

}  // namespace serval
