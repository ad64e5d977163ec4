#pragma once
// A deterministic toy ModelRunner for engine tests. It keeps a paged "KV
// cache" that stores, per slot, the token and position written there, and
// computes each requested row's logits from the sequence's whole history as
// read back through the Batch's block table (a row's history: the positions
// up to its own). So a wrong slot mapping, block
// table, position or context length changes the output (or fails a check).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "runtime/model_runner.h"

namespace serval::testing {

class FakeModelRunner : public ModelRunner {
 public:
  FakeModelRunner(int64_t vocab_size, int32_t block_size, int64_t num_blocks,
                  int64_t max_position = 0);

  void forward(const Batch& batch, std::vector<float>& logits) override;
  // Copies the slots' (token, position) entries, as the real runner copies K/V.
  void copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& src_dst) override;
  const ModelConfig& config() const override { return config_; }
  int32_t block_size() const override { return block_size_; }
  int64_t num_blocks() const override { return num_blocks_; }

  // Logits the toy model gives after `history` (also the test's reference).
  static std::vector<float> toy_logits(const std::vector<int32_t>& history, int64_t vocab_size);

  std::vector<Batch> batches;  // every batch seen, in order
  std::vector<std::pair<int32_t, int32_t>> copies;  // every block copy, in order

 private:
  struct Entry {
    int32_t token = -1;
    int32_t position = -1;
  };
  ModelConfig config_;
  int32_t block_size_;
  int64_t num_blocks_;
  std::vector<Entry> cache_;  // num_blocks * block_size slots
};

// Greedy continuation of `prompt` by the toy model, computed directly.
std::vector<int32_t> toy_greedy(std::vector<int32_t> prompt, int64_t vocab_size, int n);

}  // namespace serval::testing
