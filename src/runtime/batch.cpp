#include "runtime/batch.h"

#include <algorithm>

#include "core/error.h"

namespace serval {

// Everything the forward pass indexes with is checked here, so that kernels can
// trust the batch: a bad batch is an error, never an out-of-range access.
void Batch::validate(int32_t block_size, int64_t num_blocks, int64_t window) const {
  SERVAL_CHECK(block_size > 0, "batch: block_size must be positive, got ", block_size);
  const int64_t T = num_tokens();
  const int64_t S = num_seqs();
  SERVAL_CHECK(T > 0, "batch: no tokens");
  SERVAL_CHECK(int64_t(positions.size()) == T, "batch: ", positions.size(), " positions for ", T, " tokens");
  SERVAL_CHECK(int64_t(slot_mapping.size()) == T, "batch: ", slot_mapping.size(),
               " slot_mapping entries for ", T, " tokens");
  SERVAL_CHECK(token_source.empty() || int64_t(token_source.size()) == T, "batch: ", token_source.size(),
               " token_source entries for ", T, " tokens");
  for (int64_t t = 0; t < int64_t(token_source.size()); ++t)
    SERVAL_CHECK(token_source[t] >= -1, "batch: token_source[", t, "] = ", token_source[t], " (-1 or a spec index)");
  SERVAL_CHECK(S > 0, "batch: no sequences (context_len is empty)");
  SERVAL_CHECK(int64_t(query_start.size()) == S + 1, "batch: query_start has ", query_start.size(),
               " entries, expected num_seqs + 1 = ", S + 1);
  SERVAL_CHECK(max_blocks_per_seq > 0, "batch: max_blocks_per_seq must be positive, got ", max_blocks_per_seq);
  SERVAL_CHECK(int64_t(block_table.size()) == S * max_blocks_per_seq, "batch: block_table has ",
               block_table.size(), " entries, expected num_seqs x max_blocks_per_seq = ", S * max_blocks_per_seq);
  SERVAL_CHECK(query_start[0] == 0, "batch: query_start[0] must be 0, got ", query_start[0]);
  SERVAL_CHECK(query_start[S] == T, "batch: query_start[", S, "] = ", query_start[S],
               " must equal the number of tokens ", T);

  // First the offsets alone, so that the loop below indexes only within [0, T).
  for (int64_t s = 0; s < S; ++s) {
    SERVAL_CHECK(query_start[s + 1] > query_start[s] && query_start[s + 1] <= T, "batch: sequence ", s,
                 " has no new tokens or runs past the ", T, " tokens (query_start ", query_start[s], " .. ",
                 query_start[s + 1], ")");
  }
  for (int64_t s = 0; s < S; ++s) {
    const int64_t begin = query_start[s], end = query_start[s + 1];
    const int64_t n_new = end - begin;
    const int64_t ctx = context_len[s];
    SERVAL_CHECK(ctx >= n_new, "batch: sequence ", s, " has context_len ", ctx, " smaller than its ", n_new,
                 " new tokens");
    const int64_t needed_blocks = (ctx + block_size - 1) / block_size;
    SERVAL_CHECK(needed_blocks <= max_blocks_per_seq, "batch: sequence ", s, " has context_len ", ctx,
                 " which needs ", needed_blocks, " blocks, more than max_blocks_per_seq ", max_blocks_per_seq);
    const int32_t* table = block_table.data() + s * max_blocks_per_seq;
    // Blocks before the first one the first new token's window reads may be released.
    const int64_t first_read = window > 0 ? std::max<int64_t>(0, ctx - n_new + 1 - window) : 0;
    for (int64_t b = 0; b < needed_blocks; ++b) {
      if (table[b] == -1 && (b + 1) * block_size <= first_read) continue;
      SERVAL_CHECK(table[b] >= 0 && table[b] < num_blocks, "batch: sequence ", s, " block_table[", b, "] = ",
                   table[b], " is outside the pool of ", num_blocks, " blocks");
    }
    for (int64_t t = begin; t < end; ++t) {
      // New tokens are the last n_new positions of the context, in order.
      const int64_t expected_pos = ctx - n_new + (t - begin);
      SERVAL_CHECK(positions[t] == expected_pos, "batch: token ", t, " of sequence ", s, " has position ",
                   positions[t], ", expected ", expected_pos, " (context_len ", ctx, ", ", n_new, " new tokens)");
      const int64_t slot = slot_mapping[t];
      SERVAL_CHECK(slot >= 0 && slot < num_blocks * block_size, "batch: slot_mapping[", t, "] = ", slot,
                   " is outside the pool of ", num_blocks * block_size, " slots");
      // Attention reads K/V back through the block table, so the slot must be where
      // the table says this position lives.
      const int64_t expected_slot = int64_t(table[expected_pos / block_size]) * block_size + expected_pos % block_size;
      SERVAL_CHECK(slot == expected_slot, "batch: slot_mapping[", t, "] = ", slot, " but block_table puts position ",
                   expected_pos, " of sequence ", s, " at slot ", expected_slot);
    }
  }

  int64_t prev = -1;
  for (size_t r = 0; r < logits_rows.size(); ++r) {
    const int64_t row = logits_rows[r];
    SERVAL_CHECK(row >= 0 && row < T, "batch: logits_rows[", r, "] = ", row, " is outside the ", T, " tokens");
    SERVAL_CHECK(row > prev, "batch: logits_rows must be strictly ascending, but logits_rows[", r, "] = ", row,
                 " follows ", prev);
    prev = row;
  }
}

}  // namespace serval
