#pragma once
// BlockTable: the KV blocks of one sequence in logical order. Token at
// position p lives in slot blocks[p / block_size] * block_size + p % block_size.
// Blocks are taken from the pool only when appended tokens need them.
//
// With the prefix cache, tables are filled through KvCacheManager (adopt,
// fork, allocate_slots with copy-on-write, commit); append_slots/release
// below are the plain, cache-unaware path.
#include <cstdint>
#include <optional>
#include <vector>

#include "kv/block_pool.h"

namespace serval {

class KvCacheManager;

class BlockTable {
 public:
  // A table entry whose block was released (KvCacheManager::release_before:
  // behind a sliding window, read by no layer again).
  static constexpr BlockId kReleased = -1;

  // Throws serval::Error if block_size < 1.
  explicit BlockTable(int32_t block_size);

  int32_t block_size() const { return block_size_; }
  const std::vector<BlockId>& blocks() const { return blocks_; }
  int64_t num_blocks() const { return int64_t(blocks_.size()); }
  // Tokens that have a slot.
  int64_t num_tokens() const { return num_tokens_; }
  // Leading full blocks already offered to the prefix cache (adopted from it,
  // or passed to KvCacheManager::commit_full_blocks).
  int64_t num_committed_blocks() const { return num_committed_blocks_; }
  // Leading entries released (kReleased).
  int64_t num_released_blocks() const { return num_released_blocks_; }
  // Blocks the table still holds.
  int64_t num_held_blocks() const { return num_blocks() - num_released_blocks_; }
  // Blocks still to take from the pool to give n more tokens a slot.
  int64_t blocks_needed(int64_t n) const;

  // Gives the next n tokens slots, taking blocks from `pool` as needed, and
  // returns the slots in token order; or returns nullopt and changes nothing
  // (neither the table nor the pool) if the pool has too few free blocks.
  std::optional<std::vector<int64_t>> append_slots(BlockPool& pool, int64_t n);

  // Slot of the token at `position`; throws if it has none (yet, or any more).
  int64_t slot(int64_t position) const;

  // Drops this table's reference to each of its blocks and empties it.
  void release(BlockPool& pool);

 private:
  friend class KvCacheManager;

  int32_t block_size_;
  std::vector<BlockId> blocks_;
  int64_t num_tokens_ = 0;
  int64_t num_committed_blocks_ = 0;
  int64_t num_released_blocks_ = 0;
};

}  // namespace serval
