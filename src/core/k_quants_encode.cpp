// f32 into K-quant super-blocks by rounding to nearest. Two shapes of sub-block
// code cover the five types:
//   affine (Q2_K, Q4_K, Q5_K): w = d * sc * q - dmin * m, q in 0..levels; the
//     sub-block's range, widened to hold 0, gives its step and its min;
//   symmetric (Q3_K, Q6_K): w = d * sc * q, q in qmin..-qmin-1; the value of
//     largest magnitude maps to qmin (as Q4_0 does), the other sign clamps.
// The sub-block scales (and mins) become multiples of the f16 super-block scales
// d = largest / max_code, rounded away from zero so that the grid still reaches
// the sub-block's extremes, and each value goes to the nearest level of its grid.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/k_quants.h"

namespace serval::k_quants {

namespace {

// A super-block's integer codes before packing.
struct Codes {
  uint16_t d = 0, dmin = 0;
  int sc[16] = {}, m[16] = {};
  int q[kSuper] = {};
};

inline int clamp_round(float v, int lo, int hi) { return std::clamp(int(std::lround(v)), lo, hi); }
inline int clamp_ceil(float v, int lo, int hi) { return std::clamp(int(std::ceil(v)), lo, hi); }

// Affine codes for `subs` sub-blocks, q in 0..levels, scales and mins in 0..max_code.
Codes affine(const float* x, int subs, int levels, int max_code) {
  const int len = kSuper / subs;
  float max_of[16], min[16], max_step = 0, max_min = 0;
  for (int s = 0; s < subs; ++s) {
    const float* v = x + s * len;
    float lo = 0, hi = v[0];  // the min is subtracted, so the range holds 0 from below
    for (int l = 0; l < len; ++l) {
      lo = std::min(lo, v[l]);
      hi = std::max(hi, v[l]);
    }
    max_of[s] = hi;
    min[s] = -lo;
    max_step = std::max(max_step, (hi - lo) / float(levels));
    max_min = std::max(max_min, min[s]);
  }
  Codes c;
  c.d = f32_to_f16(max_step / float(max_code));
  c.dmin = f32_to_f16(max_min / float(max_code));
  const float d = f16_to_f32(c.d), dmin = f16_to_f32(c.dmin);
  for (int s = 0; s < subs; ++s) {
    // The min first (at or below the smallest value), then the step from it to the largest.
    c.m[s] = dmin > 0 ? clamp_ceil(min[s] / dmin, 0, max_code) : 0;
    const float offset = dmin * float(c.m[s]);
    const float step = std::max(0.0f, (max_of[s] + offset) / float(levels));
    c.sc[s] = d > 0 ? clamp_ceil(step / d, 0, max_code) : 0;
    const float scale = d * float(c.sc[s]);
    for (int l = 0; l < len; ++l)
      c.q[s * len + l] = scale > 0 ? clamp_round((x[s * len + l] + offset) / scale, 0, levels) : 0;
  }
  return c;
}

// Symmetric codes for 16 sub-blocks of 16, q in qmin..-qmin-1, scales in -max_code..max_code.
Codes symmetric(const float* x, int qmin, int max_code) {
  float step[16], max_step = 0;
  for (int s = 0; s < 16; ++s) {
    float amax = 0, max = 0;
    for (int l = 0; l < 16; ++l)
      if (std::fabs(x[16 * s + l]) > amax) { amax = std::fabs(x[16 * s + l]); max = x[16 * s + l]; }
    step[s] = max / float(qmin);
    max_step = std::max(max_step, amax / float(-qmin));
  }
  Codes c;
  c.d = f32_to_f16(max_step / float(max_code));
  const float d = f16_to_f32(c.d);
  for (int s = 0; s < 16; ++s) {
    const int mag = d > 0 ? clamp_ceil(std::fabs(step[s]) / d, 0, max_code) : 0;
    c.sc[s] = step[s] < 0 ? -mag : mag;
    const float scale = d * float(c.sc[s]);
    for (int l = 0; l < 16; ++l)
      c.q[16 * s + l] = scale != 0 ? clamp_round(x[16 * s + l] / scale, qmin, -qmin - 1) : 0;
  }
  return c;
}

}  // namespace

void quantize_q2_k(const float* src, void* dst, int64_t blocks) {
  auto* b = static_cast<BlockQ2_K*>(dst);
  for (int64_t i = 0; i < blocks; ++i, src += kSuper) {
    const Codes c = affine(src, 16, 3, 15);
    std::memset(&b[i], 0, sizeof(BlockQ2_K));
    b[i].d = c.d;
    b[i].dmin = c.dmin;
    for (int s = 0; s < 16; ++s) b[i].scales[s] = uint8_t(c.sc[s] | c.m[s] << 4);
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 32; ++l) b[i].qs[32 * h + l] |= uint8_t(c.q[128 * h + 32 * k + l] << (2 * k));
  }
}

void quantize_q3_k(const float* src, void* dst, int64_t blocks) {
  auto* b = static_cast<BlockQ3_K*>(dst);
  for (int64_t i = 0; i < blocks; ++i, src += kSuper) {
    const Codes c = symmetric(src, -4, 31);
    std::memset(&b[i], 0, sizeof(BlockQ3_K));
    b[i].d = c.d;
    for (int s = 0; s < 16; ++s) set_scale_q3_k(b[i].scales, s, c.sc[s] + 32);
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 32; ++l) {
          const int u = c.q[128 * h + 32 * k + l] + 4;  // 0..7: bit 2 set for q >= 0
          b[i].qs[32 * h + l] |= uint8_t((u & 3) << (2 * k));
          b[i].hmask[l] |= uint8_t((u >> 2) << (4 * h + k));
        }
  }
}

void quantize_q4_k(const float* src, void* dst, int64_t blocks) {
  auto* b = static_cast<BlockQ4_K*>(dst);
  for (int64_t i = 0; i < blocks; ++i, src += kSuper) {
    const Codes c = affine(src, 8, 15, 63);
    std::memset(&b[i], 0, sizeof(BlockQ4_K));
    b[i].d = c.d;
    b[i].dmin = c.dmin;
    for (int s = 0; s < 8; ++s) {
      set_scale_min_k4(b[i].scales, s, c.sc[s], c.m[s]);
      for (int l = 0; l < 32; ++l) b[i].qs[32 * (s / 2) + l] |= uint8_t(c.q[32 * s + l] << (4 * (s % 2)));
    }
  }
}

void quantize_q5_k(const float* src, void* dst, int64_t blocks) {
  auto* b = static_cast<BlockQ5_K*>(dst);
  for (int64_t i = 0; i < blocks; ++i, src += kSuper) {
    const Codes c = affine(src, 8, 31, 63);
    std::memset(&b[i], 0, sizeof(BlockQ5_K));
    b[i].d = c.d;
    b[i].dmin = c.dmin;
    for (int s = 0; s < 8; ++s) {
      set_scale_min_k4(b[i].scales, s, c.sc[s], c.m[s]);
      for (int l = 0; l < 32; ++l) {
        const int q = c.q[32 * s + l];
        b[i].qs[32 * (s / 2) + l] |= uint8_t((q & 0x0f) << (4 * (s % 2)));
        b[i].qh[l] |= uint8_t((q >> 4) << s);
      }
    }
  }
}

void quantize_q6_k(const float* src, void* dst, int64_t blocks) {
  auto* b = static_cast<BlockQ6_K*>(dst);
  for (int64_t i = 0; i < blocks; ++i, src += kSuper) {
    const Codes c = symmetric(src, -32, 127);
    std::memset(&b[i], 0, sizeof(BlockQ6_K));
    b[i].d = c.d;
    for (int s = 0; s < 16; ++s) b[i].scales[s] = int8_t(c.sc[s]);
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 32; ++l) {
          const int u = c.q[128 * h + 32 * k + l] + 32;  // 0..63
          b[i].ql[64 * h + 32 * (k % 2) + l] |= uint8_t((u & 0x0f) << (4 * (k / 2)));
          b[i].qh[32 * h + l] |= uint8_t((u >> 4) << (2 * k));
        }
  }
}

}  // namespace serval::k_quants
