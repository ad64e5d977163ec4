#pragma once
// Test helpers for the runtime: tiny random Llama-family models (config +
// WeightStore), a naive double-precision reference forward pass, and a small
// paged-KV bookkeeper that builds Batches the way the engine will.
#include <cstdint>
#include <random>
#include <vector>

#include "model/model_config.h"
#include "model/weights.h"
#include "runtime/batch.h"

namespace serval::testing {

struct TinySpec {
  std::string arch = "llama";
  int64_t vocab = 61, hidden = 32, inter = 48, layers = 3, heads = 4, kv_heads = 2, head_dim = 8;
  int64_t rope_dim = 0;  // 0: head_dim
  RopeStyle style = RopeStyle::Neox;
  RopeScaling scaling;
  bool bias = false, qk_norm = false, tied = false;
  bool rope_freqs = false;           // add a rope_freqs.weight tensor
  DType matrix_dtype = DType::F32;   // storage dtype of the linear weights
  uint32_t seed = 1;
};

ModelConfig tiny_config(const TinySpec& spec);
WeightStore tiny_weights(const ModelConfig& cfg, const TinySpec& spec);

// Logits of every position of `tokens` (one sequence, from position 0), computed
// with plain loops in double over a contiguous KV cache. Weights are read through
// to_f32, as any loader would.
std::vector<std::vector<double>> reference_logits(const ModelConfig& cfg, const WeightStore& w,
                                                  const std::vector<int32_t>& tokens);

// Block bookkeeping for tests: hands out block ids from a given order and
// builds ragged batches.
class PagedSeqs {
 public:
  PagedSeqs(int32_t block_size, std::vector<int32_t> free_blocks, int32_t max_blocks_per_seq);
  int add_sequence();
  // One step: sequence ids[i] appends chunks[i]. Logits rows: every token if
  // all_logits, else the last token of each chunk.
  Batch step(const std::vector<int>& ids, const std::vector<std::vector<int32_t>>& chunks, bool all_logits);

 private:
  int32_t block_size_;
  std::vector<int32_t> free_;
  size_t next_free_ = 0;
  int32_t max_blocks_;
  std::vector<std::vector<int32_t>> blocks_;
  std::vector<int32_t> lens_;
};

// max |a - b| / max |b| over all elements.
double rel_error(const std::vector<float>& a, const std::vector<double>& b);
double rel_error(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace serval::testing
