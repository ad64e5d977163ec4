#include "fake_model_runner.h"

#include <algorithm>
#include <set>

namespace serval::testing {

FakeModelRunner::FakeModelRunner(int64_t vocab_size, int32_t block_size, int64_t num_blocks,
                                 int64_t max_position)
    : block_size_(block_size), num_blocks_(num_blocks) {
  config_.architecture = "fake";
  config_.vocab_size = vocab_size;
  config_.max_position = max_position;
  cache_.resize(size_t(num_blocks * block_size));
}

std::vector<float> FakeModelRunner::toy_logits(const std::vector<int32_t>& history,
                                               int64_t vocab_size) {
  uint64_t h = 0x12345678;
  for (int32_t t : history) h = (h ^ uint64_t(t)) * 0x100000001B3ull + 0x9E3779B97F4A7C15ull;
  std::vector<float> logits(static_cast<size_t>(vocab_size));
  for (int64_t v = 0; v < vocab_size; ++v) {
    uint64_t x = h ^ (uint64_t(v) * 0xBF58476D1CE4E5B9ull);
    x = (x ^ (x >> 31)) * 0x94D049BB133111EBull;
    x ^= x >> 29;
    logits[size_t(v)] = float(x >> 40) / float(1 << 24) * 6.0f;  // [0, 6)
  }
  return logits;
}

std::vector<int32_t> toy_greedy(std::vector<int32_t> tokens, int64_t vocab_size, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const auto logits = FakeModelRunner::toy_logits(tokens, vocab_size);
    const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(next);
    tokens.push_back(next);
  }
  return out;
}

void FakeModelRunner::copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& src_dst) {
  for (const auto& [src, dst] : src_dst) {
    ASSERT_TRUE(src >= 0 && src < num_blocks_ && dst >= 0 && dst < num_blocks_);
    for (int32_t i = 0; i < block_size_; ++i)
      cache_[size_t(int64_t(dst) * block_size_ + i)] = cache_[size_t(int64_t(src) * block_size_ + i)];
  }
  copies.insert(copies.end(), src_dst.begin(), src_dst.end());
}

void FakeModelRunner::forward(const Batch& b, std::vector<float>& logits) {
  batches.push_back(b);
  // The runtime's own consistency check must accept every batch the engine builds.
  ASSERT_NO_THROW(b.validate(block_size_, num_blocks_));
  const int32_t T = b.num_tokens(), S = b.num_seqs(), bs = block_size_;
  ASSERT_EQ(b.positions.size(), size_t(T));
  ASSERT_EQ(b.slot_mapping.size(), size_t(T));
  ASSERT_EQ(b.query_start.size(), size_t(S + 1));
  ASSERT_EQ(b.query_start.front(), 0);
  ASSERT_EQ(b.query_start.back(), T);
  ASSERT_EQ(b.block_table.size(), size_t(S) * size_t(b.max_blocks_per_seq));
  ASSERT_TRUE(std::is_sorted(b.logits_rows.begin(), b.logits_rows.end()));

  std::set<int64_t> written;
  for (int32_t s = 0; s < S; ++s) {
    const int32_t begin = b.query_start[s], end = b.query_start[s + 1];
    ASSERT_LT(begin, end) << "sequence " << s << " has no new tokens";
    const int32_t ctx = b.context_len[s];
    const int32_t* row = &b.block_table[size_t(s) * b.max_blocks_per_seq];
    const int32_t used = (ctx + bs - 1) / bs;
    ASSERT_LE(used, b.max_blocks_per_seq);
    for (int32_t j = 0; j < b.max_blocks_per_seq; ++j) {
      if (j < used) {
        ASSERT_GE(row[j], 0);
        ASSERT_LT(row[j], num_blocks_);
      } else {
        ASSERT_EQ(row[j], -1) << "padding of sequence " << s;
      }
    }
    for (int32_t t = begin; t < end; ++t) {
      const int32_t pos = b.positions[t];
      ASSERT_EQ(pos, ctx - (end - t)) << "new tokens are the last of the context";
      const int64_t slot = b.slot_mapping[t];
      ASSERT_EQ(slot, int64_t(row[pos / bs]) * bs + pos % bs) << "slot outside its block table";
      ASSERT_TRUE(written.insert(slot).second) << "two tokens write slot " << slot;
      cache_[size_t(slot)] = Entry{b.token_ids[t], pos};
    }
  }

  logits.clear();
  for (int32_t r : b.logits_rows) {
    const int32_t s = int32_t(std::upper_bound(b.query_start.begin(), b.query_start.end(), r) -
                              b.query_start.begin()) - 1;
    ASSERT_LT(r, b.query_start[s + 1]) << "logits row outside the batch";
    const int32_t* row = &b.block_table[size_t(s) * b.max_blocks_per_seq];
    // The row's token and what comes before it (several rows of a sequence:
    // a draft's positions, speculative decoding).
    std::vector<int32_t> history;
    for (int32_t pos = 0; pos <= b.positions[r]; ++pos) {
      const Entry& e = cache_[size_t(int64_t(row[pos / bs]) * bs + pos % bs)];
      ASSERT_EQ(e.position, pos) << "KV slot holds another position (overwritten?)";
      history.push_back(e.token);
    }
    const auto row_logits = toy_logits(history, config_.vocab_size);
    logits.insert(logits.end(), row_logits.begin(), row_logits.end());
  }
}

}  // namespace serval::testing
