#pragma once
// BlockPool: the physical KV blocks of one cache, as ids 0..num_blocks-1 with a
// free list and reference counts. A block is free when its count is 0; sharing
// (prefix cache, copy-on-write forks) raises the count with incref.
//
// Owned by the engine loop thread: no locks (DESIGN.md §1).
// The prefix cache will add blocks that are unreferenced but still cached
// (evictable, LRU); they will live outside the free list until evicted.
#include <cstdint>
#include <vector>

namespace serval {

using BlockId = int32_t;

class BlockPool {
 public:
  // Throws serval::Error if num_blocks is negative or above INT32_MAX.
  explicit BlockPool(int64_t num_blocks);

  int64_t num_blocks() const { return int64_t(ref_counts_.size()); }
  int64_t num_free() const { return int64_t(free_list_.size()); }
  int64_t num_used() const { return num_blocks() - num_free(); }

  // Appends n free blocks (each with ref count 1) to `out` and returns true,
  // or returns false and changes nothing if fewer than n are free.
  bool allocate(int64_t n, std::vector<BlockId>& out);

  // Another holder of an allocated block. Throws on a free or unknown id.
  void incref(BlockId id);
  // Drops one reference; at 0 the block returns to the free list (returns true).
  // Throws on a free block (double free) or an unknown id.
  bool free(BlockId id);

  int32_t ref_count(BlockId id) const;

 private:
  void check_id(BlockId id, const char* op) const;

  std::vector<int32_t> ref_counts_;
  // Stack of free ids; the most recently freed block is reused first (its
  // memory is the most likely to be in cache).
  std::vector<BlockId> free_list_;
};

}  // namespace serval
