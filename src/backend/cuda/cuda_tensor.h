#pragma once
// A Tensor's data and a KV layer's pools as the CUDA kernels read them. (Kept out of cuda_common.cuh,
// which CUTLASS's files include: serval::Tensor would meet cute's Tensor.)
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kv_layout.h"
#include "runtime/backend.h"

namespace serval::cuda {

inline bf16* bf(const Tensor& t) { return static_cast<bf16*>(t.data); }

// A layer's pools in the element type T (the KV dtype).
template <typename T>
KvPoolLayout<T> kv_layout(const KvLayer& kv, const KvGeometry& g) {
  return {static_cast<T*>(kv.k.data()), static_cast<T*>(kv.v.data()), int(g.num_kv_heads), int(g.head_dim)};
}

}  // namespace serval::cuda
