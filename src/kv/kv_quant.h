#pragma once
// The quantized KV cache (--kv-cache-dtype fp8|int8): pools of 1-byte codes,
// fp8 e4m3 or int8, with one f32 scale per (layer, KV head) for K and one for
// V; a value is code * scale. Per head, not per layer: heads' ranges differ by
// an order of magnitude in real models, and one layer-wide scale would leave
// the quiet heads a few codes. Writing rounds to nearest even and saturates
// (+-448 for e4m3, +-127 for int8); NaN becomes e4m3's NaN, int8's 0.
#include <cmath>
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/fp8.h"

namespace serval {

// Whether pools of `t` hold codes with scales (FP8_E4M3, I8).
inline bool kv_dtype_quantized(DType t) { return t == DType::FP8_E4M3 || t == DType::I8; }

// The largest code: 448 (e4m3) or 127 (int8).
inline float kv_code_max(DType t) { return t == DType::FP8_E4M3 ? 448.0f : 127.0f; }

// Calibrated scales leave room above the calibration's amax: values beyond
// it saturate. e4m3 keeps its relative precision over ~15 binades, so a
// 2x margin costs it nothing that matters; int8's step grows with the
// margin, so it gets less.
inline float kv_scale_margin(DType t) { return t == DType::FP8_E4M3 ? 2.0f : 1.25f; }

// The scale for a head whose calibration amax is `amax`:
// amax * margin / code max (an all-zero head gets the scale of amax 1e-6).
inline float kv_scale_for_amax(DType t, float amax) {
  return std::fmax(amax, 1e-6f) * kv_scale_margin(t) / kv_code_max(t);
}

// The code of x under `inv_scale` (1 / scale, so the CPU and GPU kernels
// round the same product).
inline uint8_t kv_quantize(DType t, float x, float inv_scale) {
  const float v = x * inv_scale;
  if (t == DType::FP8_E4M3) return f32_to_fp8_e4m3(v);
  if (!(v == v)) return 0;  // NaN
  const float r = std::nearbyint(std::fmin(std::fmax(v, -127.0f), 127.0f));  // ties to even
  return uint8_t(int8_t(r));
}

inline float kv_dequantize(DType t, uint8_t code, float scale) {
  return (t == DType::FP8_E4M3 ? fp8_e4m3_to_f32(code) : float(int8_t(code))) * scale;
}

// n values of x into codes at dst; n codes at src into f32 at dst.
inline void kv_quantize_row(DType t, const float* x, float scale, uint8_t* dst, int64_t n) {
  const float inv = 1.0f / scale;
  for (int64_t i = 0; i < n; ++i) dst[i] = kv_quantize(t, x[i], inv);
}
// Every e4m3 byte as f32: a table lookup decodes a row several times faster
// than the bit arithmetic.
const float* fp8_e4m3_table();

inline void kv_dequantize_row(DType t, const uint8_t* src, float scale, float* dst, int64_t n) {
  if (t == DType::FP8_E4M3) {
    const float* table = fp8_e4m3_table();
    for (int64_t i = 0; i < n; ++i) dst[i] = table[src[i]] * scale;
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = float(int8_t(src[i])) * scale;
  }
}

// --kv-cache-dtype's value as the pools' element type: "auto" is
// `compute` (the activation dtype), "fp8" FP8_E4M3, "int8" I8. Throws
// serval::Error naming the flag and the accepted values for another.
DType parse_kv_cache_dtype(const std::string& name, DType compute);

}  // namespace serval
