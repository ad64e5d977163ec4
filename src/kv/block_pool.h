#pragma once
// BlockPool: the physical KV blocks of one cache, as ids 0..num_blocks-1 with
// reference counts. Every block is in exactly one of three states:
//   free        ref count 0, not in the prefix cache, on the free list;
//   evictable   ref count 0 but still in the prefix cache (its K/V may be
//               reused by a later request; evicted only when blocks run out);
//   referenced  ref count > 0 (held by one or more block tables; it may also
//               be in the prefix cache).
// so num_free() + num_cached_evictable() + num_referenced() == num_blocks().
// The pool only counts; which evictable block to evict (leaf-first, LRU) is
// decided by the PrefixTree, which calls uncache().
//
// Owned by the engine loop thread: no locks (DESIGN.md §1).
#include <cstdint>
#include <vector>

namespace serval {

using BlockId = int32_t;

class BlockPool {
 public:
  // Throws serval::Error if num_blocks is negative or above INT32_MAX.
  explicit BlockPool(int64_t num_blocks);

  int64_t num_blocks() const { return int64_t(ref_counts_.size()); }
  // Blocks on the free list (not referenced, not cached).
  int64_t num_free() const { return int64_t(free_list_.size()); }
  // Blocks that are cached but unreferenced: reclaimable by eviction.
  int64_t num_cached_evictable() const { return num_evictable_; }
  // Blocks held by at least one block table.
  int64_t num_referenced() const { return num_blocks() - num_free() - num_evictable_; }
  // Same as num_referenced() (kept for callers that predate the prefix cache).
  int64_t num_used() const { return num_referenced(); }

  // Appends n blocks from the free list (each with ref count 1) to `out` and
  // returns true, or returns false and changes nothing if fewer than n are
  // free. Never evicts: evictable blocks must be uncache()d first.
  bool allocate(int64_t n, std::vector<BlockId>& out);

  // Another holder of a referenced or evictable block. Returns true if the
  // block was evictable (it is referenced now). Throws on a free or unknown id.
  bool incref(BlockId id);
  // Drops one reference. Returns true if the block became unreferenced: it
  // goes to the free list, or stays evictable if it is cached.
  // Throws on an unreferenced block (double free) or an unknown id.
  bool free(BlockId id);

  // A referenced block enters the prefix cache. Throws if it is not
  // referenced or already cached.
  void mark_cached(BlockId id);
  // A cached block leaves the prefix cache; if unreferenced it becomes free.
  void uncache(BlockId id);
  bool is_cached(BlockId id) const;

  int32_t ref_count(BlockId id) const;

  // Recounts every state from scratch; throws serval::Error on any mismatch.
  void check_invariants() const;

 private:
  void check_id(BlockId id, const char* op) const;

  std::vector<int32_t> ref_counts_;
  std::vector<uint8_t> cached_;
  int64_t num_evictable_ = 0;
  // Stack of free ids; the most recently freed block is reused first (its
  // memory is the most likely to be in cache).
  std::vector<BlockId> free_list_;
};

}  // namespace serval
