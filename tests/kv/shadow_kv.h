#pragma once
// ShadowKv: a stand-in for the K/V pools in prefix-cache tests. Each slot
// holds the token whose "K/V" was written there (-1: never written), so a
// test can check that every sequence reads back exactly its own tokens —
// which fails if a shared block is overwritten, a copy-on-write copy is
// missed, or the prefix cache returns a block of another prefix.
#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kv/block_table.h"

namespace serval::testing {

class ShadowKv {
 public:
  ShadowKv(int64_t num_blocks, int32_t block_size)
      : block_size_(block_size), cells_(size_t(num_blocks * block_size), -1) {}

  // What a forward does: the copies first, then the new tokens' K/V.
  void copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& copies) {
    for (auto [src, dst] : copies)
      for (int32_t i = 0; i < block_size_; ++i)
        cells_[size_t(dst) * block_size_ + i] = cells_[size_t(src) * block_size_ + i];
  }
  void write(const std::vector<int64_t>& slots, std::span<const int32_t> tokens) {
    ASSERT_EQ(slots.size(), tokens.size());
    for (size_t i = 0; i < slots.size(); ++i) cells_[size_t(slots[i])] = tokens[i];
  }
  // The first n tokens of the sequence read back from its table.
  bool holds(const BlockTable& table, std::span<const int32_t> tokens, int64_t n) const {
    for (int64_t p = 0; p < n; ++p)
      if (cells_[size_t(table.slot(p))] != tokens[size_t(p)]) return false;
    return true;
  }

 private:
  int32_t block_size_;
  std::vector<int32_t> cells_;
};

}  // namespace serval::testing
