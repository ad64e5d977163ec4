#pragma once
// KvLayerSpec: what one layer's paged KV cache holds. The model's definition
// gives one per layer (model_def.h); the runner sizes and allocates the pools
// from them, every kernel that writes or reads K/V takes its layout from the
// same description, and the KV manager frees blocks no layer's window reads.
#include <cstdint>

#include "core/dtype.h"

namespace serval {

struct KvLayerSpec {
  // Element type of the K and V pools (the backend's activation dtype today;
  // room for fp8/int8 with scale tensors).
  DType dtype = DType::F32;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  // Sliding-window attention: a query reads the `window` latest positions,
  // itself included; 0: every position before it.
  int64_t window = 0;

  // K and V of one token.
  int64_t bytes_per_token() const { return 2 * dtype_bytes(dtype, int64_t(num_kv_heads) * head_dim); }
  bool operator==(const KvLayerSpec&) const = default;
};

}  // namespace serval
