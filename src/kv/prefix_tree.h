#pragma once
// PrefixTree: the radix tree of the prefix cache (RadixAttention-style, one
// node per full KV block). A node holds one block's token ids and its
// physical block; its children are keyed by the chain hash of their prefix
// (block_hash.h), and every lookup also compares the tokens. The path from
// the root to a node spells the whole token prefix whose K/V the blocks hold.
//
// Invariant kept by KvCacheManager: a referenced node's ancestors are all
// referenced (tables hold root paths), so every cached unreferenced block can
// be evicted, leaf-first. Eviction takes the least recently used evictable
// leaf (ref count 0, no children); that may turn its parent into one.
//
// Nodes are indexed by their block id (a block is in at most one node).
#include <cstdint>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kv/block_hash.h"
#include "kv/block_pool.h"

namespace serval {

class PrefixTree {
 public:
  static constexpr BlockId kRoot = -1;

  // `pool` must outlive the tree. An empty `hash` uses hash_block_tokens
  // (tests pass a colliding one).
  PrefixTree(BlockPool& pool, int32_t block_size, BlockHashFn hash = {});

  // Blocks of the longest cached chain that spells a prefix of `tokens`,
  // at most max_blocks long; marks them used now (LRU).
  std::vector<BlockId> match(std::span<const int32_t> tokens, int64_t max_blocks);

  bool contains(BlockId block) const;
  // Adds `block` (referenced, not cached) holding `tokens` (one full block)
  // as a child of `parent` (kRoot or a cached block). Returns false and
  // changes nothing if the parent already has a child with that hash: the
  // same tokens cached in another block, or a hash collision.
  bool insert(BlockId parent, std::span<const int32_t> tokens, BlockId block);
  // Marks cached blocks used now (LRU); ignores blocks not in the tree.
  void touch(std::span<const BlockId> blocks);

  // The pool's ref count of a cached block moved between 0 and 1.
  void on_ref_count_changed(BlockId block);

  // Evicts up to n evictable blocks, LRU leaf first; they go to the pool's
  // free list. Returns how many were evicted.
  int64_t evict(int64_t n);

  // Changes whenever a block leaves the tree (a match taken before is stale).
  uint64_t epoch() const { return epoch_; }
  int64_t num_cached_blocks() const { return num_nodes_; }
  int64_t num_evicted() const { return num_evicted_; }

  // Checks links, hashes, depths, pool flags, the evictable set, and that no
  // referenced node has an unreferenced parent. Throws serval::Error.
  void check_invariants() const;

 private:
  struct Node {
    bool in_tree = false;
    BlockId parent = kRoot;
    int32_t depth = 0;  // blocks from the root, this one included
    uint64_t hash = 0;
    uint64_t last_access = 0;
    std::vector<int32_t> tokens;
    std::unordered_map<uint64_t, BlockId> children;
  };

  uint64_t hash_of(uint64_t parent_hash, std::span<const int32_t> tokens) const;
  const std::unordered_map<uint64_t, BlockId>& children_of(BlockId parent) const;
  std::unordered_map<uint64_t, BlockId>& children_of(BlockId parent);
  bool is_evictable(BlockId block) const;
  // Re-files `block` in the evictable set after a change of its state.
  void refresh(BlockId block);
  void set_last_access(BlockId block, uint64_t tick);

  BlockPool& pool_;
  int32_t block_size_;
  BlockHashFn hash_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, BlockId> root_children_;
  // (last_access, block) of every evictable leaf; begin() is evicted first.
  std::set<std::pair<uint64_t, BlockId>> evictable_;
  uint64_t clock_ = 0;
  uint64_t epoch_ = 0;
  int64_t num_nodes_ = 0;
  int64_t num_evicted_ = 0;
};

}  // namespace serval
