#pragma once
// KvCacheManager: the engine's view of the paged KV cache. It owns the block
// pool and hands out slots to sequences, whose BlockTables it fills. Sequences
// own their tables; the manager keeps no per-sequence state (yet: the prefix
// cache will add a radix tree of shared blocks here).
#include <cstdint>
#include <optional>
#include <vector>

#include "kv/block_pool.h"
#include "kv/block_table.h"

namespace serval {

struct KvUsage {
  int64_t num_blocks = 0;
  int64_t free_blocks = 0;
  int64_t used_blocks = 0;
  int32_t block_size = 0;
  double fraction_used() const { return num_blocks ? double(used_blocks) / num_blocks : 0.0; }
  int64_t capacity_tokens() const { return num_blocks * block_size; }
};

class KvCacheManager {
 public:
  // Throws serval::Error on a negative pool size or a block size < 1.
  KvCacheManager(int64_t num_blocks, int32_t block_size);

  int32_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return pool_.num_blocks(); }
  const BlockPool& pool() const { return pool_; }

  // An empty table for a new sequence.
  BlockTable new_table() const { return BlockTable(block_size_); }

  // Whether n more tokens of `table` can get slots now.
  bool can_allocate(const BlockTable& table, int64_t n) const;
  // Slots for the next n tokens of `table`, or nullopt with nothing changed.
  std::optional<std::vector<int64_t>> allocate_slots(BlockTable& table, int64_t n);
  // Returns all of the table's blocks; the table is empty afterwards.
  void free(BlockTable& table);

  KvUsage usage() const;

 private:
  void check_table(const BlockTable& table) const;

  int32_t block_size_;
  BlockPool pool_;
};

}  // namespace serval
