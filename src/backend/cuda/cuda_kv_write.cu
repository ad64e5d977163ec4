// Writes the new tokens' K and V rows into the paged pools at their slots.
#include "backend/cuda/cuda_backend.h"

namespace serval::cuda {

namespace {

// One thread per 8 elements of a token's K (and the same 8 of its V).
__global__ void kv_write_vec_kernel(const Bf16x8* k, const Bf16x8* v, const int64_t* slots, Bf16x8* K, Bf16x8* V,
                                    int64_t tokens, int64_t row8) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= tokens * row8) return;
  const int64_t t = i / row8, c = i % row8;
  const int64_t dst = slots[t] * row8 + c;
  K[dst] = k[i];
  V[dst] = v[i];
}

__global__ void kv_write_kernel(const bf16* k, const bf16* v, const int64_t* slots, bf16* K, bf16* V, int64_t tokens,
                                int64_t row) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= tokens * row) return;
  const int64_t t = i / row, c = i % row;
  K[slots[t] * row + c] = k[i];
  V[slots[t] * row + c] = v[i];
}

}  // namespace

void CudaBackend::kv_write(const Tensor& k, const Tensor& v, const int64_t* slot_mapping, const KvLayer& kv,
                           const KvGeometry& g) {
  const int64_t row = int64_t(g.num_kv_heads) * g.head_dim;
  SERVAL_CHECK(k.dtype == DType::BF16 && v.dtype == DType::BF16 && k.cols == row && v.cols == row,
               "kv_write: k and v must be bf16 of width ", row, ", got ", k.cols, " and ", v.cols);
  if (k.rows == 0) return;
  if (row % 8 == 0) {
    const int64_t n = k.rows * (row / 8);
    kv_write_vec_kernel<<<ceil_div(n, 256), 256, 0, stream_>>>(
        static_cast<const Bf16x8*>(k.data), static_cast<const Bf16x8*>(v.data), slot_mapping,
        static_cast<Bf16x8*>(kv.k.data()), static_cast<Bf16x8*>(kv.v.data()), k.rows, row / 8);
  } else {
    const int64_t n = k.rows * row;
    kv_write_kernel<<<ceil_div(n, 256), 256, 0, stream_>>>(bf(k), bf(v), slot_mapping,
                                                           static_cast<bf16*>(kv.k.data()),
                                                           static_cast<bf16*>(kv.v.data()), k.rows, row);
  }
  SERVAL_CUDA_LAUNCH_CHECK();
}

}  // namespace serval::cuda
