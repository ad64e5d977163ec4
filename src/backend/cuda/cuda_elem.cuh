#pragma once
// Element access for kernels that run on rows of either activation dtype of
// the CUDA backend: bf16 (the default) or f32 (--dtype float32). Values are
// read into f32 and written back rounded to the row's type, one element at a
// time or eight at a time (16 bytes of bf16, 32 bytes of f32).
#include "backend/cuda/cuda_common.cuh"

namespace serval::cuda {

// Eight f32 values moved as two 16-byte accesses: the f32 twin of Bf16x8.
struct alignas(16) F32x8 {
  float4 a, b;
};

template <typename T>
struct Vec8Of;
template <>
struct Vec8Of<bf16> {
  using type = Bf16x8;
};
template <>
struct Vec8Of<float> {
  using type = F32x8;
};
// Eight consecutive elements of type T as one aligned value.
template <typename T>
using Vec8 = typename Vec8Of<T>::type;

__device__ __forceinline__ void vec8_to_f32(const Bf16x8& v, float* f) { bf16x8_to_f32(v, f); }
__device__ __forceinline__ void vec8_to_f32(const F32x8& v, float* f) {
  f[0] = v.a.x, f[1] = v.a.y, f[2] = v.a.z, f[3] = v.a.w, f[4] = v.b.x, f[5] = v.b.y, f[6] = v.b.z, f[7] = v.b.w;
}
template <typename T>
__device__ __forceinline__ Vec8<T> f32_to_vec8(const float* f);
template <>
__device__ __forceinline__ Bf16x8 f32_to_vec8<bf16>(const float* f) {
  return f32_to_bf16x8(f);
}
template <>
__device__ __forceinline__ F32x8 f32_to_vec8<float>(const float* f) {
  return F32x8{make_float4(f[0], f[1], f[2], f[3]), make_float4(f[4], f[5], f[6], f[7])};
}

// Chunk c (elements 8c..8c+7) of a row as f32, and back. The row must be
// 16-byte aligned.
__device__ __forceinline__ void load8(const bf16* p, int64_t c, float* f) {
  bf16x8_to_f32(reinterpret_cast<const Bf16x8*>(p)[c], f);
}
__device__ __forceinline__ void load8(const float* p, int64_t c, float* f) {
  const float4 a = reinterpret_cast<const float4*>(p)[2 * c], b = reinterpret_cast<const float4*>(p)[2 * c + 1];
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
__device__ __forceinline__ void store8(bf16* p, int64_t c, const float* f) {
  reinterpret_cast<Bf16x8*>(p)[c] = f32_to_bf16x8(f);
}
__device__ __forceinline__ void store8(float* p, int64_t c, const float* f) {
  reinterpret_cast<float4*>(p)[2 * c] = make_float4(f[0], f[1], f[2], f[3]);
  reinterpret_cast<float4*>(p)[2 * c + 1] = make_float4(f[4], f[5], f[6], f[7]);
}

// Element i of a row as f32, and back.
__device__ __forceinline__ float load1(const bf16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float load1(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ void store1(bf16* p, int64_t i, float v) { p[i] = __float2bfloat16(v); }
__device__ __forceinline__ void store1(float* p, int64_t i, float v) { p[i] = v; }

}  // namespace serval::cuda
