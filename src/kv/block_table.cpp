#include "kv/block_table.h"

#include "core/error.h"

namespace serval {

BlockTable::BlockTable(int32_t block_size) : block_size_(block_size) {
  SERVAL_CHECK(block_size >= 1, "KV block size must be at least 1, got ", block_size);
}

int64_t BlockTable::blocks_needed(int64_t n) const {
  SERVAL_CHECK(n >= 0, "cannot append a negative number of tokens (", n, ")");
  const int64_t blocks_after = (num_tokens_ + n + block_size_ - 1) / block_size_;
  return blocks_after > num_blocks() ? blocks_after - num_blocks() : 0;
}

std::optional<std::vector<int64_t>> BlockTable::append_slots(BlockPool& pool, int64_t n) {
  if (!pool.allocate(blocks_needed(n), blocks_)) return std::nullopt;
  std::vector<int64_t> slots;
  slots.reserve(size_t(n));
  for (int64_t p = num_tokens_; p < num_tokens_ + n; ++p)
    slots.push_back(int64_t(blocks_[p / block_size_]) * block_size_ + p % block_size_);
  num_tokens_ += n;
  return slots;
}

int64_t BlockTable::slot(int64_t position) const {
  SERVAL_CHECK(position >= 0 && position < num_tokens_, "token position ", position,
               " has no KV slot (the sequence has ", num_tokens_, ")");
  SERVAL_CHECK(position / block_size_ >= num_released_blocks_, "token position ", position,
               " has no KV slot: its block was released behind the sliding window");
  return int64_t(blocks_[position / block_size_]) * block_size_ + position % block_size_;
}

void BlockTable::release(BlockPool& pool) {
  for (BlockId id : blocks_)
    if (id != kReleased) pool.free(id);
  blocks_.clear();
  num_tokens_ = 0;
  num_committed_blocks_ = 0;
  num_released_blocks_ = 0;
}

}  // namespace serval
