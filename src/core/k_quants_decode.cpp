// K-quant super-blocks to f32, element for element what GGUF's reference
// dequantizers give: d * sc and dmin * m are exact in f32 (11-bit f16 times a
// small integer), so is their product with q, so each value is rounded at most
// once (in the subtraction of the min), fused multiply-add or not.
#include "core/dtype.h"
#include "core/k_quants.h"

namespace serval::k_quants {

void dequantize_q2_k(const void* src, float* dst, int64_t blocks) {
  const auto* b = static_cast<const BlockQ2_K*>(src);
  for (int64_t i = 0; i < blocks; ++i, dst += kSuper) {
    const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 32; ++l) {
          const int e = 128 * h + 32 * k + l;
          const uint8_t sm = b[i].scales[e / 16];
          const int q = (b[i].qs[32 * h + l] >> (2 * k)) & 3;
          dst[e] = d * float(sm & 0x0f) * float(q) - dmin * float(sm >> 4);
        }
  }
}

void dequantize_q3_k(const void* src, float* dst, int64_t blocks) {
  const auto* b = static_cast<const BlockQ3_K*>(src);
  for (int64_t i = 0; i < blocks; ++i, dst += kSuper) {
    const float d = f16_to_f32(b[i].d);
    float scale[16];
    for (int s = 0; s < 16; ++s) scale[s] = d * float(scale_q3_k(b[i].scales, s) - 32);
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 32; ++l) {
          const int e = 128 * h + 32 * k + l;
          const int low = (b[i].qs[32 * h + l] >> (2 * k)) & 3;
          const bool high = (b[i].hmask[l] >> (4 * h + k)) & 1;
          dst[e] = scale[e / 16] * float(high ? low : low - 4);
        }
  }
}

void dequantize_q4_k(const void* src, float* dst, int64_t blocks) {
  const auto* b = static_cast<const BlockQ4_K*>(src);
  for (int64_t i = 0; i < blocks; ++i, dst += kSuper) {
    const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    for (int s = 0; s < 8; ++s) {
      int sc, m;
      scale_min_k4(b[i].scales, s, sc, m);
      const float scale = d * float(sc), min = dmin * float(m);
      const uint8_t* qs = b[i].qs + 32 * (s / 2);
      const int shift = 4 * (s % 2);
      for (int l = 0; l < 32; ++l) dst[32 * s + l] = scale * float((qs[l] >> shift) & 0x0f) - min;
    }
  }
}

void dequantize_q5_k(const void* src, float* dst, int64_t blocks) {
  const auto* b = static_cast<const BlockQ5_K*>(src);
  for (int64_t i = 0; i < blocks; ++i, dst += kSuper) {
    const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    for (int s = 0; s < 8; ++s) {
      int sc, m;
      scale_min_k4(b[i].scales, s, sc, m);
      const float scale = d * float(sc), min = dmin * float(m);
      const uint8_t* qs = b[i].qs + 32 * (s / 2);
      const int shift = 4 * (s % 2);
      for (int l = 0; l < 32; ++l) {
        const int q = ((qs[l] >> shift) & 0x0f) | ((b[i].qh[l] >> s) & 1) << 4;
        dst[32 * s + l] = scale * float(q) - min;
      }
    }
  }
}

void dequantize_q6_k(const void* src, float* dst, int64_t blocks) {
  const auto* b = static_cast<const BlockQ6_K*>(src);
  for (int64_t i = 0; i < blocks; ++i, dst += kSuper) {
    const float d = f16_to_f32(b[i].d);
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 32; ++l) {
          const int e = 128 * h + 32 * k + l;
          const int low = (b[i].ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0f;
          const int high = (b[i].qh[32 * h + l] >> (2 * k)) & 3;
          dst[e] = d * float(b[i].scales[e / 16]) * float((low | high << 4) - 32);
        }
  }
}

}  // namespace serval::k_quants
