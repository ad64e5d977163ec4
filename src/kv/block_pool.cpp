#include "kv/block_pool.h"

#include <limits>

#include "core/error.h"

namespace serval {

BlockPool::BlockPool(int64_t num_blocks) {
  SERVAL_CHECK(num_blocks >= 0 && num_blocks <= std::numeric_limits<BlockId>::max(),
               "KV block pool size must be in [0, ", std::numeric_limits<BlockId>::max(),
               "], got ", num_blocks);
  ref_counts_.assign(size_t(num_blocks), 0);
  cached_.assign(size_t(num_blocks), 0);
  free_list_.reserve(size_t(num_blocks));
  // Reversed, so that a fresh pool hands out 0, 1, 2, ...
  for (int64_t id = num_blocks - 1; id >= 0; --id) free_list_.push_back(BlockId(id));
}

bool BlockPool::allocate(int64_t n, std::vector<BlockId>& out) {
  SERVAL_CHECK(n >= 0, "cannot allocate a negative number of KV blocks (", n, ")");
  if (n > num_free()) return false;
  for (int64_t i = 0; i < n; ++i) {
    const BlockId id = free_list_.back();
    free_list_.pop_back();
    ref_counts_[id] = 1;
    out.push_back(id);
  }
  return true;
}

void BlockPool::check_id(BlockId id, const char* op) const {
  SERVAL_CHECK(id >= 0 && id < num_blocks(), op, ": KV block id ", id, " is out of range [0, ",
               num_blocks(), ")");
}

bool BlockPool::incref(BlockId id) {
  check_id(id, "incref");
  const bool was_evictable = ref_counts_[id] == 0 && cached_[id];
  SERVAL_CHECK(ref_counts_[id] > 0 || was_evictable, "incref: KV block ", id, " is free");
  if (was_evictable) --num_evictable_;
  ++ref_counts_[id];
  return was_evictable;
}

bool BlockPool::free(BlockId id) {
  check_id(id, "free");
  SERVAL_CHECK(ref_counts_[id] > 0, "free: KV block ", id, " is already free (double free)");
  if (--ref_counts_[id] > 0) return false;
  if (cached_[id])
    ++num_evictable_;
  else
    free_list_.push_back(id);
  return true;
}

void BlockPool::mark_cached(BlockId id) {
  check_id(id, "mark_cached");
  SERVAL_CHECK(ref_counts_[id] > 0, "mark_cached: KV block ", id, " is not referenced");
  SERVAL_CHECK(!cached_[id], "mark_cached: KV block ", id, " is already cached");
  cached_[id] = 1;
}

void BlockPool::uncache(BlockId id) {
  check_id(id, "uncache");
  SERVAL_CHECK(cached_[id], "uncache: KV block ", id, " is not cached");
  cached_[id] = 0;
  if (ref_counts_[id] == 0) {
    --num_evictable_;
    free_list_.push_back(id);
  }
}

bool BlockPool::is_cached(BlockId id) const {
  check_id(id, "is_cached");
  return cached_[id] != 0;
}

int32_t BlockPool::ref_count(BlockId id) const {
  check_id(id, "ref_count");
  return ref_counts_[id];
}

void BlockPool::check_invariants() const {
  std::vector<uint8_t> on_free_list(ref_counts_.size(), 0);
  for (BlockId id : free_list_) {
    SERVAL_CHECK(id >= 0 && id < num_blocks(), "KV pool: free list holds bad id ", id);
    SERVAL_CHECK(!on_free_list[id], "KV pool: block ", id, " is on the free list twice");
    on_free_list[id] = 1;
  }
  int64_t free = 0, evictable = 0, referenced = 0;
  for (size_t id = 0; id < ref_counts_.size(); ++id) {
    const int32_t rc = ref_counts_[id];
    SERVAL_CHECK(rc >= 0, "KV pool: block ", id, " has ref count ", rc);
    if (rc > 0) {
      ++referenced;
      SERVAL_CHECK(!on_free_list[id], "KV pool: referenced block ", id, " is on the free list");
    } else if (cached_[id]) {
      ++evictable;
      SERVAL_CHECK(!on_free_list[id], "KV pool: cached block ", id, " is on the free list");
    } else {
      ++free;
      SERVAL_CHECK(on_free_list[id], "KV pool: unreferenced block ", id,
                   " is neither cached nor on the free list (leaked)");
    }
  }
  SERVAL_CHECK(free == num_free() && evictable == num_evictable_ &&
                   free + evictable + referenced == num_blocks(),
               "KV pool: counted ", free, " free, ", evictable, " evictable, ", referenced,
               " referenced of ", num_blocks(), " but track ", num_free(), " free, ",
               num_evictable_, " evictable");
}

}  // namespace serval
