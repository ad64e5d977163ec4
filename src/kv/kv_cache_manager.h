#pragma once
// KvCacheManager: the engine's view of the paged KV cache. It owns the block
// pool and, when enabled, the prefix cache (a radix tree of full blocks,
// DESIGN.md §3). Sequences own their BlockTables; the manager fills them.
//
// Life of a sequence with the prefix cache:
//   PrefixMatch m = kv.match_prefix(prompt);        // longest cached prefix
//   if (kv.can_adopt_and_allocate(m, chunk)) {
//     kv.adopt_prefix(table, m);                     // shares m's blocks
//     auto a = kv.allocate_slots(table, chunk);      // slots + COW copies
//     runner.copy_blocks(a->copies); forward(...);   // copies first!
//     kv.commit_full_blocks(table, computed_tokens); // cache new full blocks
//   }
//   kv.free(table);                                  // finish/abort/preempt
// adopt_prefix must follow match_prefix before any other allocation (an
// eviction in between makes the match stale; adopt then throws).
//
// Sharing is block-granular: only full blocks enter the cache; a partially
// filled block is private unless fork() shares it, and a sequence that
// appends into a block shared with another (ref count > 1) gets a private
// copy first (allocate_slots returns the copies to make).
//
// Engine loop thread only: no locks.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "kv/block_hash.h"
#include "kv/block_pool.h"
#include "kv/block_table.h"
#include "kv/prefix_tree.h"

namespace serval {

// Gauges of the pool (metrics: KV blocks used/cached/free, usage fraction).
struct KvUsage {
  int64_t num_blocks = 0;
  int64_t free_blocks = 0;    // on the free list
  int64_t cached_blocks = 0;  // in the prefix cache, unreferenced (evictable)
  int64_t used_blocks = 0;    // referenced by at least one sequence
  int32_t block_size = 0;
  double fraction_used() const { return num_blocks ? double(used_blocks) / num_blocks : 0.0; }
  int64_t capacity_tokens() const { return num_blocks * block_size; }
  // What an allocation can get: free plus evictable blocks.
  int64_t available_blocks() const { return free_blocks + cached_blocks; }
};

// Counters of the prefix cache (metrics: prefix-cache queries and hits).
struct PrefixCacheStats {
  int64_t query_tokens = 0;    // prompt tokens looked up (counted by adopt_prefix)
  int64_t hit_tokens = 0;      // of those, found in the cache
  int64_t evicted_blocks = 0;  // cached blocks reclaimed for new allocations
  int64_t cow_copies = 0;      // blocks copied on write
  double hit_rate() const { return query_tokens ? double(hit_tokens) / query_tokens : 0.0; }
};

// The result of match_prefix: cached blocks holding the first num_tokens
// tokens of the looked-up sequence (num_tokens = blocks.size() * block_size,
// always < the sequence's length so at least one token is computed).
struct PrefixMatch {
  std::vector<BlockId> blocks;
  int64_t num_tokens = 0;
  int64_t num_queried_tokens = 0;  // length of the looked-up sequence
  uint64_t epoch = 0;              // the tree's eviction epoch when matched
};

// The result of allocate_slots. Before the forward pass that writes `slots`,
// the caller must copy each (src, dst) block pair (ModelRunner::copy_blocks).
struct SlotAllocation {
  std::vector<int64_t> slots;
  std::vector<std::pair<int32_t, int32_t>> copies;
};

class KvCacheManager {
 public:
  // Throws serval::Error on a negative pool size or a block size < 1.
  // enable_prefix_cache=false: no tree; match_prefix never hits and
  // commit_full_blocks does nothing (forks and copy-on-write still work).
  // block_hash replaces the chain hash (tests force collisions with it).
  KvCacheManager(int64_t num_blocks, int32_t block_size, bool enable_prefix_cache = false,
                 BlockHashFn block_hash = {});

  int32_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return pool_->num_blocks(); }
  bool prefix_cache_enabled() const { return tree_ != nullptr; }
  const BlockPool& pool() const { return *pool_; }

  // An empty table for a new sequence.
  BlockTable new_table() const { return BlockTable(block_size_); }

  // Whether n more tokens of `table` can get slots now (counting evictable
  // blocks and a copy-on-write of its last block).
  bool can_allocate(const BlockTable& table, int64_t n) const;
  // Slots for the next n tokens of `table`, or nullopt with nothing changed.
  // Takes free blocks first, then evicts cached unreferenced ones. If the
  // table's last, partially filled block is shared, the table gets a copy.
  [[nodiscard]] std::optional<SlotAllocation> allocate_slots(BlockTable& table, int64_t n);
  // Drops all of the table's blocks; the table is empty afterwards. Its cached
  // blocks stay in the prefix cache (evictable once unreferenced).
  void free(BlockTable& table);

  // Shrinks the table to its first num_tokens slots (speculative decoding:
  // the slots of rejected draft tokens); blocks left empty go back to the
  // pool. Throws if num_tokens exceeds the table or cuts into blocks already
  // offered to the prefix cache.
  void truncate(BlockTable& table, int64_t num_tokens);

  // Releases the table's blocks wholly before `position` (those behind a
  // sliding window that no layer reads again); their entries become
  // BlockTable::kReleased. Returns how many it released. Throws with the
  // prefix cache enabled (cached prefixes are whole chains of blocks).
  int64_t release_before(BlockTable& table, int64_t position);

  // A new table sharing all of `parent`'s blocks (n > 1 samples of a prompt);
  // whichever appends into a shared partial block first gets a copy of it.
  BlockTable fork(const BlockTable& parent);

  // Longest cached prefix of `tokens` in full blocks, leaving at least one
  // token to compute. No side effect but marking the blocks recently used.
  PrefixMatch match_prefix(std::span<const int32_t> tokens);
  // Whether adopt_prefix(match) followed by allocate_slots(n more tokens)
  // would succeed now.
  bool can_adopt_and_allocate(const PrefixMatch& match, int64_t n) const;
  // Shares the matched blocks into `table`, which must be empty; the table
  // then has match.num_tokens tokens. Counts the query and hit tokens.
  // Throws if blocks were evicted since match_prefix (the match is stale).
  void adopt_prefix(BlockTable& table, const PrefixMatch& match);
  // After a forward wrote K/V for `tokens`, caches the table's newly filled
  // full blocks. `tokens` must be exactly the tokens whose K/V is written
  // (the first num_computed_tokens of the sequence, not a just-sampled token
  // nor slots allocated for a later chunk): a block cached too early would
  // serve K/V that was never computed. Throws if tokens exceed the table.
  // A block whose prefix is already cached in another block stays private
  // (blocks are never swapped under a running sequence), and so do the
  // table's later blocks.
  void commit_full_blocks(BlockTable& table, std::span<const int32_t> tokens);

  KvUsage usage() const;
  PrefixCacheStats prefix_cache_stats() const;

  // Checks the pool's counts and the tree's structure; throws serval::Error.
  void check_invariants() const;

 private:
  void check_table(const BlockTable& table) const;
  bool needs_copy_on_write(const BlockTable& table, int64_t n) const;
  // Makes at least n blocks free, evicting if needed; false if impossible.
  bool make_free(int64_t n);
  void acquire(BlockId block);
  void release(BlockId block);

  int32_t block_size_;
  // On the heap so the tree's reference to it survives a move of the manager.
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<PrefixTree> tree_;
  PrefixCacheStats stats_;
};

}  // namespace serval
