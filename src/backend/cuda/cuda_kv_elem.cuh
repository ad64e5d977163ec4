#pragma once
// Element loads and stores of a quantized KV cache (--kv-cache-dtype
// fp8|int8) for the CUDA kernels: the same codes as kv/kv_quant.h, bit for
// bit (value = code * scale; writes multiply by the scale's IEEE reciprocal,
// round to nearest even and saturate: +-448 for e4m3, +-127 for int8; NaN
// is e4m3's NaN and int8's 0), so a pool written here reads the same on the
// CPU backend, and the other way round.
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace serval::cuda {

// Tags for a pool's 1-byte element type, as kernels take it by template.
struct KvFp8 {};
struct KvInt8 {};

// 1 / scale, rounded as the CPU's 1.0f / scale (whatever -use_fast_math says).
__device__ __forceinline__ float kv_inv_scale(float scale) { return __frcp_rn(scale); }

__device__ __forceinline__ uint8_t kv_encode(KvFp8, float x, float inv) {
  const float v = __fmul_rn(x, inv);
  if (v != v) return uint8_t(__float_as_uint(v) >> 24 & 0x80) | 0x7f;  // NaN keeps its sign, as the CPU's
  return uint8_t(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}
__device__ __forceinline__ uint8_t kv_encode(KvInt8, float x, float inv) {
  const float v = __fmul_rn(x, inv);
  if (v != v) return 0;
  return uint8_t(int8_t(__float2int_rn(fminf(fmaxf(v, -127.0f), 127.0f))));
}

__device__ __forceinline__ float kv_decode(KvFp8, uint8_t c) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(c), __NV_E4M3);
  return __half2float(__half(h));
}
__device__ __forceinline__ float kv_decode(KvInt8, uint8_t c) { return float(int8_t(c)); }

// Eight values as eight codes in one 8-byte store, and back (code * scale).
template <typename Q>
__device__ __forceinline__ uint2 kv_encode8(const float* f, float inv) {
  uint32_t w[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < 8; ++i) w[i / 4] |= uint32_t(kv_encode(Q{}, f[i], inv)) << (8 * (i % 4));
  return make_uint2(w[0], w[1]);
}
template <typename Q>
__device__ __forceinline__ void kv_decode8(uint2 codes, float scale, float* f) {
  const uint32_t w[2] = {codes.x, codes.y};
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = kv_decode(Q{}, uint8_t(w[i / 4] >> (8 * (i % 4)))) * scale;
}

}  // namespace serval::cuda
