#pragma once
// Paged attention over a quantized KV cache (fp8 / int8 codes with per-head
// scales, cuda_kv_elem.cuh): a plain kernel, one block per (token, query
// head), that dequantizes each key and value on load. Correct for any step
// (prefill chunks, decodes, sliding windows); not tuned: the tensor-core
// decode and prefill kernels read the activation dtype only.
#include <cuda_runtime.h>

#include "runtime/backend.h"

namespace serval::cuda {

void attention_over_codes(const Tensor& q, const KvLayer& kv, const KvGeometry& g, const BatchView& b,
                          int32_t num_heads, float scale, Tensor out, cudaStream_t stream);

}  // namespace serval::cuda
