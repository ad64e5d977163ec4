#include "kv/kv_cache_manager.h"

#include "core/error.h"

namespace serval {

KvCacheManager::KvCacheManager(int64_t num_blocks, int32_t block_size)
    : block_size_(block_size), pool_(num_blocks) {
  SERVAL_CHECK(block_size >= 1, "KV block size must be at least 1, got ", block_size);
}

void KvCacheManager::check_table(const BlockTable& table) const {
  SERVAL_CHECK(table.block_size() == block_size_, "block table has block size ",
               table.block_size(), " but the KV cache uses ", block_size_);
}

bool KvCacheManager::can_allocate(const BlockTable& table, int64_t n) const {
  check_table(table);
  return table.blocks_needed(n) <= pool_.num_free();
}

std::optional<std::vector<int64_t>> KvCacheManager::allocate_slots(BlockTable& table, int64_t n) {
  check_table(table);
  return table.append_slots(pool_, n);
}

void KvCacheManager::free(BlockTable& table) {
  check_table(table);
  table.release(pool_);
}

KvUsage KvCacheManager::usage() const {
  return KvUsage{pool_.num_blocks(), pool_.num_free(), pool_.num_used(), block_size_};
}

}  // namespace serval
