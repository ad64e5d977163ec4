#include "engine/batch_builder.h"

#include <algorithm>

#include "core/error.h"

namespace serval {

BatchBuilder::BatchBuilder(int32_t block_size) : block_size_(block_size) {
  SERVAL_CHECK(block_size >= 1, "KV block size must be at least 1, got ", block_size);
}

Batch BatchBuilder::build(std::span<const ScheduledChunk> items) const {
  Batch batch;
  build(items, batch);
  return batch;
}

namespace {
// Empties `batch`, keeping its storage.
void reset(Batch& batch) {
  batch.token_ids.clear();
  batch.token_source.clear();
  batch.positions.clear();
  batch.query_start.assign(1, 0);
  batch.context_len.clear();
  batch.slot_mapping.clear();
  batch.logits_rows.clear();
}
}  // namespace

void BatchBuilder::build(std::span<const ScheduledChunk> items, Batch& batch, StepRows* rows) const {
  reset(batch);
  if (rows) {
    rows->sampled.clear();
    rows->scored.clear();
  }
  const bool any_fed = std::any_of(items.begin(), items.end(), [](const ScheduledChunk& c) { return c.fed(); });

  int32_t max_blocks = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const ScheduledChunk& item = items[i];
    const Sequence& seq = *item.seq;
    const int64_t start = item.first();
    const int64_t end = start + item.num_new_tokens;
    if (item.fed()) {
      SERVAL_CHECK(item.num_new_tokens == 1 && start == seq.num_tokens(), "sequence ", seq.id(),
                   ": a fed chunk is one token at position ", seq.num_tokens(), ", got ", item.num_new_tokens,
                   " at ", start);
    } else {
      SERVAL_CHECK(item.num_new_tokens >= 1 && start >= seq.num_computed_tokens() &&
                       end <= seq.num_tokens_with_draft(),
                   "sequence ", seq.id(), ": cannot schedule ", item.num_new_tokens, " new tokens from position ",
                   start, " (", seq.num_computed_tokens(), " of ", seq.num_tokens(), " computed)");
    }
    const BlockTable& table = seq.block_table();
    SERVAL_CHECK(table.block_size() == block_size_, "sequence ", seq.id(),
                 ": block table has block size ", table.block_size(), ", the batch uses ",
                 block_size_);
    SERVAL_CHECK(table.num_tokens() >= end, "sequence ", seq.id(), ": KV slots cover ",
                 table.num_tokens(), " tokens but the step needs ", end,
                 " (allocate slots before building the batch)");
    const int32_t first_row = int32_t(batch.token_ids.size());
    for (int64_t p = start; p < end; ++p) {
      batch.token_ids.push_back(item.fed() ? 0 : seq.token_at(p));  // a fed token: the device's
      if (any_fed) batch.token_source.push_back(item.source_row);
      batch.positions.push_back(int32_t(p));
      batch.slot_mapping.push_back(table.slot(p));
    }
    // Scored prompt positions: each predicts the prompt token after it.
    const int64_t scored_end = !item.fed() && seq.scores_prompt() ? std::min(end, seq.num_prompt_tokens() - 1) : start;
    if (scored_end > start) {
      if (rows) rows->scored.push_back({i, int32_t(batch.logits_rows.size()), start, int32_t(scored_end - start)});
      for (int64_t p = start; p < scored_end; ++p) batch.logits_rows.push_back(first_row + int32_t(p - start));
    }
    if (!item.fed() && !seq.draft_ids().empty()) {
      // A row with a draft: the last known token and each draft token get
      // a row (verification samples at every position), the first one first.
      SERVAL_CHECK(end == seq.num_tokens_with_draft() && start == seq.num_tokens() - 1, "sequence ", seq.id(),
                   ": a row with ", seq.draft_ids().size(), " draft tokens computes its last known token and the ",
                   "draft, got ", item.num_new_tokens, " tokens from position ", start);
      if (rows) rows->sampled.push_back(int32_t(batch.logits_rows.size()));
      for (int64_t p = start; p < end; ++p) batch.logits_rows.push_back(first_row + int32_t(p - start));
    } else if (item.fed() || end == seq.num_tokens()) {
      if (rows) rows->sampled.push_back(int32_t(batch.logits_rows.size()));
      batch.logits_rows.push_back(int32_t(batch.token_ids.size()) - 1);
    }
    batch.query_start.push_back(int32_t(batch.token_ids.size()));
    batch.context_len.push_back(int32_t(end));
    max_blocks = std::max(max_blocks, int32_t((end + block_size_ - 1) / block_size_));
  }

  fill_block_table(items, max_blocks, batch);
}

void BatchBuilder::fill_block_table(std::span<const ScheduledChunk> items, int32_t max_blocks, Batch& batch) const {
  // Each row lists the blocks holding the sequence's context, padded with -1.
  batch.max_blocks_per_seq = max_blocks;
  batch.block_table.assign(items.size() * size_t(max_blocks), -1);
  for (size_t s = 0; s < items.size(); ++s) {
    const std::vector<BlockId>& blocks = items[s].seq->block_table().blocks();
    const int32_t used = (batch.context_len[s] + block_size_ - 1) / block_size_;
    std::copy_n(blocks.begin(), used, batch.block_table.begin() + s * max_blocks);
  }
}

}  // namespace serval
