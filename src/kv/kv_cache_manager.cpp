#include "kv/kv_cache_manager.h"

#include <algorithm>

#include "core/error.h"

namespace serval {

KvCacheManager::KvCacheManager(int64_t num_blocks, int32_t block_size, bool enable_prefix_cache,
                               BlockHashFn block_hash)
    : block_size_(block_size), pool_(std::make_unique<BlockPool>(num_blocks)) {
  SERVAL_CHECK(block_size >= 1, "KV block size must be at least 1, got ", block_size);
  if (enable_prefix_cache)
    tree_ = std::make_unique<PrefixTree>(*pool_, block_size, std::move(block_hash));
}

void KvCacheManager::check_table(const BlockTable& table) const {
  SERVAL_CHECK(table.block_size() == block_size_, "block table has block size ",
               table.block_size(), " but the KV cache uses ", block_size_);
}

void KvCacheManager::acquire(BlockId block) {
  if (pool_->incref(block) && tree_) tree_->on_ref_count_changed(block);
}

void KvCacheManager::release(BlockId block) {
  if (pool_->free(block) && tree_) tree_->on_ref_count_changed(block);
}

bool KvCacheManager::make_free(int64_t n) {
  if (n <= pool_->num_free()) return true;
  if (n > pool_->num_free() + pool_->num_cached_evictable() || !tree_) return false;
  const int64_t evicted = tree_->evict(n - pool_->num_free());
  stats_.evicted_blocks += evicted;
  return n <= pool_->num_free();
}

// Appending into a partially filled block that another table also holds.
bool KvCacheManager::needs_copy_on_write(const BlockTable& table, int64_t n) const {
  return n > 0 && table.num_tokens() % block_size_ != 0 &&
         pool_->ref_count(table.blocks().back()) > 1;
}

bool KvCacheManager::can_allocate(const BlockTable& table, int64_t n) const {
  check_table(table);
  const int64_t need = table.blocks_needed(n) + (needs_copy_on_write(table, n) ? 1 : 0);
  return need <= pool_->num_free() + pool_->num_cached_evictable();
}

std::optional<SlotAllocation> KvCacheManager::allocate_slots(BlockTable& table, int64_t n) {
  check_table(table);
  const bool cow = needs_copy_on_write(table, n);
  if (!make_free(table.blocks_needed(n) + (cow ? 1 : 0))) return std::nullopt;
  SlotAllocation out;
  if (cow) {
    std::vector<BlockId> copy;
    SERVAL_CHECK(pool_->allocate(1, copy), "internal error: no free KV block for a copy");
    const BlockId src = table.blocks_.back();
    out.copies.emplace_back(src, copy[0]);
    table.blocks_.back() = copy[0];
    release(src);
    ++stats_.cow_copies;
  }
  auto slots = table.append_slots(*pool_, n);
  SERVAL_CHECK(slots.has_value(), "internal error: KV blocks vanished during allocation");
  out.slots = std::move(*slots);
  return out;
}

void KvCacheManager::free(BlockTable& table) {
  check_table(table);
  // Releasing is the blocks' last use: they age from now on (LRU).
  if (tree_) tree_->touch(table.blocks_);
  for (BlockId b : table.blocks_)
    if (b != BlockTable::kReleased) release(b);
  table.blocks_.clear();
  table.num_tokens_ = 0;
  table.num_committed_blocks_ = 0;
  table.num_released_blocks_ = 0;
}

void KvCacheManager::truncate(BlockTable& table, int64_t num_tokens) {
  check_table(table);
  SERVAL_CHECK(num_tokens >= 0 && num_tokens <= table.num_tokens(), "truncate: cannot keep ", num_tokens,
               " slots of a block table with ", table.num_tokens());
  SERVAL_CHECK(num_tokens >= table.num_committed_blocks_ * block_size_, "truncate: keeping ", num_tokens,
               " slots would cut into the ", table.num_committed_blocks_, " blocks offered to the prefix cache");
  const int64_t keep = std::max((num_tokens + block_size_ - 1) / block_size_, table.num_released_blocks_);
  while (table.num_blocks() > keep) {
    const BlockId b = table.blocks_.back();
    table.blocks_.pop_back();
    if (b != BlockTable::kReleased) release(b);
  }
  table.num_tokens_ = num_tokens;
}

int64_t KvCacheManager::release_before(BlockTable& table, int64_t position) {
  check_table(table);
  SERVAL_CHECK(!tree_, "release_before: sliding-window release needs the prefix cache off");
  const int64_t upto = std::min(std::max<int64_t>(position, 0) / block_size_, table.num_blocks());
  int64_t released = 0;
  for (int64_t i = table.num_released_blocks_; i < upto; ++i) {
    release(table.blocks_[size_t(i)]);
    table.blocks_[size_t(i)] = BlockTable::kReleased;
    ++released;
  }
  table.num_released_blocks_ = std::max(table.num_released_blocks_, upto);
  return released;
}

BlockTable KvCacheManager::fork(const BlockTable& parent) {
  check_table(parent);
  BlockTable child = parent;
  for (BlockId b : child.blocks_)
    if (b != BlockTable::kReleased) acquire(b);
  return child;
}

PrefixMatch KvCacheManager::match_prefix(std::span<const int32_t> tokens) {
  PrefixMatch m;
  m.num_queried_tokens = int64_t(tokens.size());
  if (!tree_ || tokens.empty()) return m;
  // At least one token stays to compute: the request needs its logits.
  const int64_t max_blocks = (int64_t(tokens.size()) - 1) / block_size_;
  m.blocks = tree_->match(tokens, max_blocks);
  m.num_tokens = int64_t(m.blocks.size()) * block_size_;
  m.epoch = tree_->epoch();
  return m;
}

bool KvCacheManager::can_adopt_and_allocate(const PrefixMatch& match, int64_t n) const {
  SERVAL_CHECK(n >= 0, "cannot allocate a negative number of tokens (", n, ")");
  const int64_t matched = int64_t(match.blocks.size());
  const int64_t need = (match.num_tokens + n + block_size_ - 1) / block_size_ - matched;
  // Adopting takes the matched unreferenced blocks out of the evictable ones.
  int64_t adopted_evictable = 0;
  for (BlockId b : match.blocks) adopted_evictable += pool_->ref_count(b) == 0;
  return std::max<int64_t>(need, 0) + adopted_evictable <=
         pool_->num_free() + pool_->num_cached_evictable();
}

void KvCacheManager::adopt_prefix(BlockTable& table, const PrefixMatch& match) {
  check_table(table);
  SERVAL_CHECK(table.num_blocks() == 0 && table.num_tokens() == 0,
               "adopt_prefix: the block table already has ", table.num_tokens(), " tokens");
  SERVAL_CHECK(match.num_tokens == int64_t(match.blocks.size()) * block_size_,
               "adopt_prefix: the match covers ", match.num_tokens, " tokens in ",
               match.blocks.size(), " blocks of ", block_size_);
  if (!tree_) {
    SERVAL_CHECK(match.blocks.empty(), "adopt_prefix: the prefix cache is disabled");
    return;
  }
  SERVAL_CHECK(match.blocks.empty() || match.epoch == tree_->epoch(),
               "adopt_prefix: stale prefix match (blocks were evicted since match_prefix)");
  stats_.query_tokens += match.num_queried_tokens;
  stats_.hit_tokens += match.num_tokens;
  for (BlockId b : match.blocks) acquire(b);
  table.blocks_ = match.blocks;
  table.num_tokens_ = match.num_tokens;
  table.num_committed_blocks_ = int64_t(match.blocks.size());
}

void KvCacheManager::commit_full_blocks(BlockTable& table, std::span<const int32_t> tokens) {
  check_table(table);
  SERVAL_CHECK(int64_t(tokens.size()) <= table.num_tokens(), "commit_full_blocks: ",
               tokens.size(), " tokens but the block table has slots for ", table.num_tokens());
  const int64_t full = int64_t(tokens.size()) / block_size_;
  if (!tree_ || full <= table.num_committed_blocks_) return;
  for (int64_t i = table.num_committed_blocks_; i < full; ++i) {
    const BlockId block = table.blocks_[size_t(i)];
    if (tree_->contains(block)) continue;  // a fork of this table cached it already
    const BlockId parent = i == 0 ? PrefixTree::kRoot : table.blocks_[size_t(i - 1)];
    // Our previous block is private: this prefix is cached elsewhere (or not
    // at all); hanging a block under another's would break the invariant that
    // referenced nodes have referenced parents.
    if (parent != PrefixTree::kRoot && !tree_->contains(parent)) break;
    const auto span = tokens.subspan(size_t(i * block_size_), size_t(block_size_));
    if (!tree_->insert(parent, span, block)) break;  // same prefix cached, or a collision
  }
  table.num_committed_blocks_ = full;
}

KvUsage KvCacheManager::usage() const {
  KvUsage u;
  u.num_blocks = pool_->num_blocks();
  u.free_blocks = pool_->num_free();
  u.cached_blocks = pool_->num_cached_evictable();
  u.used_blocks = pool_->num_referenced();
  u.block_size = block_size_;
  return u;
}

PrefixCacheStats KvCacheManager::prefix_cache_stats() const { return stats_; }

void KvCacheManager::check_invariants() const {
  pool_->check_invariants();
  if (tree_) {
    tree_->check_invariants();
    SERVAL_CHECK(tree_->num_evicted() == stats_.evicted_blocks,
                 "KV cache: eviction counter out of step with the tree");
  } else {
    SERVAL_CHECK(pool_->num_cached_evictable() == 0, "KV cache: cached blocks without a tree");
  }
}

}  // namespace serval
