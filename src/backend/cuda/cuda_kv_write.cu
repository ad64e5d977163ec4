// Writes the new tokens' K and V rows into the paged pools at their slots, in
// the KV cache's dtype (the activation dtype: bf16, or f32 with --dtype float32).
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_elem.cuh"

namespace serval::cuda {

namespace {

// One thread per 8 elements of a token's K (and the same 8 of its V).
template <typename T>
__global__ void kv_write_vec_kernel(const Vec8<T>* k, const Vec8<T>* v, const int64_t* slots, KvPoolLayout<T> kv,
                                    int64_t tokens, int64_t row8) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= tokens * row8) return;
  const int64_t t = i / row8, c = i % row8;
  reinterpret_cast<Vec8<T>*>(kv.at(false, slots[t]))[c] = k[i];
  reinterpret_cast<Vec8<T>*>(kv.at(true, slots[t]))[c] = v[i];
}

template <typename T>
__global__ void kv_write_kernel(const T* k, const T* v, const int64_t* slots, KvPoolLayout<T> kv, int64_t tokens,
                                int64_t row) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= tokens * row) return;
  const int64_t t = i / row, c = i % row;
  kv.at(false, slots[t])[c] = k[i];
  kv.at(true, slots[t])[c] = v[i];
}

template <typename T>
void launch_kv_write(const Tensor& k, const Tensor& v, const int64_t* slot_mapping, const KvPoolLayout<T>& kv,
                     cudaStream_t stream) {
  const int64_t row = kv.row();
  if (row % 8 == 0) {
    const int64_t n = k.rows * (row / 8);
    kv_write_vec_kernel<T><<<ceil_div(n, 256), 256, 0, stream>>>(static_cast<const Vec8<T>*>(k.data),
                                                                  static_cast<const Vec8<T>*>(v.data), slot_mapping,
                                                                  kv, k.rows, row / 8);
  } else {
    const int64_t n = k.rows * row;
    kv_write_kernel<T><<<ceil_div(n, 256), 256, 0, stream>>>(static_cast<const T*>(k.data),
                                                             static_cast<const T*>(v.data), slot_mapping, kv, k.rows,
                                                             row);
  }
  SERVAL_CUDA_LAUNCH_CHECK();
}

}  // namespace

void CudaBackend::kv_write(const Tensor& k, const Tensor& v, const int64_t* slot_mapping, const KvLayer& kv,
                           const KvGeometry& g) {
  const DType act = cfg_.act_dtype;
  const int64_t row = int64_t(g.num_kv_heads) * g.head_dim;
  SERVAL_CHECK(k.dtype == act && v.dtype == act && k.cols == row && v.cols == row, "kv_write: k and v must be ",
               dtype_name(act), " of width ", row, ", got ", k.cols, " and ", v.cols);
  if (k.rows == 0) return;
  dev_.bind();
  if (act == DType::F32)
    launch_kv_write<float>(k, v, slot_mapping, kv_layout<float>(kv, g), dev_.stream());
  else
    launch_kv_write<bf16>(k, v, slot_mapping, kv_layout<bf16>(kv, g), dev_.stream());
}

}  // namespace serval::cuda
