#pragma once
// Batch: the only input of a forward pass. A step mixes prefill chunks and
// decodes of several sequences in one flat ("ragged") batch without padding.
#include <cstdint>
#include <vector>

namespace serval {

struct Batch {
  // T new tokens of all scheduled sequences, concatenated, and their positions.
  std::vector<int32_t> token_ids;
  std::vector<int32_t> positions;
  // S+1 offsets: sequence s owns rows [query_start[s], query_start[s+1]).
  std::vector<int32_t> query_start;
  // S: tokens of each sequence in the KV cache after this step (cached + new).
  std::vector<int32_t> context_len;
  // S x max_blocks_per_seq physical block ids in logical order, row-major; unused
  // entries are -1.
  std::vector<int32_t> block_table;
  int32_t max_blocks_per_seq = 0;
  // T: physical slot (block * block_size + offset) each new token's K/V goes to.
  std::vector<int64_t> slot_mapping;
  // R: rows (indices into the T tokens) whose logits are needed, ascending.
  std::vector<int32_t> logits_rows;
  // Empty, or T entries: -1 where token_ids[t] is the token, else the index
  // of a spec of the sample started just before this step
  // (ModelRunner::start_sample), whose token, drawn on the device, is token t:
  // a step can be queued before the host has the tokens it continues from.
  std::vector<int32_t> token_source;

  int32_t num_tokens() const { return int32_t(token_ids.size()); }
  int32_t num_seqs() const { return int32_t(context_len.size()); }
  // Throws serval::Error if the arrays are inconsistent (sizes, ranges, order).
  // `window` > 0 (sliding-window attention in every layer): table entries of
  // blocks wholly behind the window of a sequence's first new token may be
  // -1 (released; no attention reads them).
  void validate(int32_t block_size, int64_t num_blocks, int64_t window = 0) const;
};

}  // namespace serval
