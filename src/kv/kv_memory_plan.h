#pragma once
// KV memory planning (DESIGN.md §3): how many KV blocks the pool gets, from a
// token count or from a fraction of the memory left after the weights, and
// the start-up line that says what that holds.
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace serval {

struct KvMemoryPlan {
  int64_t num_blocks = 0;
  int32_t block_size = 16;
  int64_t bytes_per_token = 0;  // K and V of one token in every layer
  int64_t context_len = 0;      // the model's context, for "sequences of C tokens"
  DType dtype = DType::F32;     // the pools' elements

  int64_t tokens() const { return num_blocks * block_size; }
  int64_t bytes() const { return tokens() * bytes_per_token; }
  double sequences() const { return context_len > 0 ? double(tokens()) / double(context_len) : 0.0; }
  // "KV cache: 4096 tokens in 256 blocks of 16 (0.13 GiB, f32), 2.0 sequences
  // of the model's context length (2048 tokens)"
  std::string describe() const;
};

// Memory the OS can give this process now (Linux MemAvailable), in bytes; 0
// when unknown.
int64_t available_memory_bytes();

// Tokens for a pool of `fraction` (0, 1] of `available_bytes` minus
// `reserved_bytes` (weights, activations), whole blocks. Throws serval::Error
// when the fraction is out of range or less than one block fits.
int64_t kv_tokens_for_memory(double fraction, int64_t available_bytes, int64_t reserved_bytes,
                             int64_t bytes_per_token, int32_t block_size);

}  // namespace serval
