#include "kv/block_pool.h"

#include <limits>

#include "core/error.h"

namespace serval {

BlockPool::BlockPool(int64_t num_blocks) {
  SERVAL_CHECK(num_blocks >= 0 && num_blocks <= std::numeric_limits<BlockId>::max(),
               "KV block pool size must be in [0, ", std::numeric_limits<BlockId>::max(),
               "], got ", num_blocks);
  ref_counts_.assign(size_t(num_blocks), 0);
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

void BlockPool::incref(BlockId id) {
  check_id(id, "incref");
  SERVAL_CHECK(ref_counts_[id] > 0, "incref: KV block ", id, " is free");
  ++ref_counts_[id];
}

bool BlockPool::free(BlockId id) {
  check_id(id, "free");
  SERVAL_CHECK(ref_counts_[id] > 0, "free: KV block ", id, " is already free (double free)");
  if (--ref_counts_[id] > 0) return false;
  free_list_.push_back(id);
  return true;
}

int32_t BlockPool::ref_count(BlockId id) const {
  check_id(id, "ref_count");
  return ref_counts_[id];
}

}  // namespace serval
