// Writes the new tokens' K and V rows into the paged pools at their slots, in
// the KV cache's dtype (the activation dtype: bf16, or f32 with --dtype
// float32; or fp8 / int8 codes under per-head scales, cuda_kv_elem.cuh).
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_elem.cuh"
#include "backend/cuda/cuda_kv_elem.cuh"
#include "kv/kv_quant.h"

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

// One thread per 8 elements of a token's K and V, as codes of Q under their
// head's scale (`scales`: K's per head, then V's). head_dim is a multiple of 8.
template <typename T, typename Q>
__global__ void kv_write_quant_kernel(const Vec8<T>* k, const Vec8<T>* v, const int64_t* slots,
                                      KvPoolLayout<uint8_t> kv, const float* scales, int64_t tokens, int64_t row8) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= tokens * row8) return;
  const int64_t t = i / row8, c = i % row8;
  const int head = int(c * 8 / kv.head_dim);
  float f[8];
  vec8_to_f32(k[i], f);
  reinterpret_cast<uint2*>(kv.at(false, slots[t]))[c] = kv_encode8<Q>(f, kv_inv_scale(scales[head]));
  vec8_to_f32(v[i], f);
  reinterpret_cast<uint2*>(kv.at(true, slots[t]))[c] = kv_encode8<Q>(f, kv_inv_scale(scales[kv.kv_heads + head]));
}

template <typename T, typename Q>
void launch_kv_write_quant(const Tensor& k, const Tensor& v, const int64_t* slot_mapping, const KvLayer& kv,
                           const KvGeometry& g, cudaStream_t stream) {
  const int64_t row8 = int64_t(g.num_kv_heads) * g.head_dim / 8, n = k.rows * row8;
  kv_write_quant_kernel<T, Q><<<ceil_div(n, 256), 256, 0, stream>>>(
      static_cast<const Vec8<T>*>(k.data), static_cast<const Vec8<T>*>(v.data), slot_mapping,
      kv_layout<uint8_t>(kv, g), static_cast<const float*>(kv.scales.data()), k.rows, row8);
  SERVAL_CUDA_LAUNCH_CHECK();
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
  if (kv_dtype_quantized(g.dtype)) {
    SERVAL_CHECK(g.head_dim % 8 == 0, "kv_write: a quantized KV cache needs head_dim a multiple of 8, got ",
                 g.head_dim);
    const bool fp8 = g.dtype == DType::FP8_E4M3;
    if (act == DType::F32)
      fp8 ? launch_kv_write_quant<float, KvFp8>(k, v, slot_mapping, kv, g, dev_.stream())
          : launch_kv_write_quant<float, KvInt8>(k, v, slot_mapping, kv, g, dev_.stream());
    else
      fp8 ? launch_kv_write_quant<bf16, KvFp8>(k, v, slot_mapping, kv, g, dev_.stream())
          : launch_kv_write_quant<bf16, KvInt8>(k, v, slot_mapping, kv, g, dev_.stream());
    return;
  }
  if (act == DType::F32)
    launch_kv_write<float>(k, v, slot_mapping, kv_layout<float>(kv, g), dev_.stream());
  else
    launch_kv_write<bf16>(k, v, slot_mapping, kv_layout<bf16>(kv, g), dev_.stream());
}

}  // namespace serval::cuda
