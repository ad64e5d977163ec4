#pragma once
// ModelRunner: runs the Llama-family forward pass over a Batch on a backend and
// owns that backend's paged KV pool. The model is written once, against the
// Backend interface (runtime/backend.h); backends supply the kernels.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/model_config.h"
#include "model/weights.h"
#include "runtime/batch.h"

namespace serval {

struct RunnerOptions {
  std::string device = "cpu";
  int32_t block_size = 16;      // tokens per KV block
  int64_t kv_cache_tokens = 0;  // 0: size the pool from kv_memory_bytes
  int64_t kv_memory_bytes = 0;  // 0: 4 sequences of min(max_position, 4096) tokens
  int threads = 0;              // CPU threads for kernels and BLAS; 0: all cores
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // Prepares weights for `opts.device` (for the CPU: converted to f32) and
  // allocates the KV pool. Throws serval::Error on unknown devices or missing
  // or mis-shaped tensors.
  static std::unique_ptr<ModelRunner> create(const ModelConfig& config, const WeightStore& weights,
                                             const RunnerOptions& opts);

  // Runs one step. Writes K/V of the new tokens to batch.slot_mapping and
  // returns logits of batch.logits_rows, row-major [R, vocab_size], in `logits`.
  virtual void forward(const Batch& batch, std::vector<float>& logits) = 0;

  virtual const ModelConfig& config() const = 0;
  virtual int32_t block_size() const = 0;
  virtual int64_t num_blocks() const = 0;
};

}  // namespace serval
