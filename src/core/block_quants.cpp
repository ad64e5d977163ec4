// Q4_1, Q5_0 and Q5_1 blocks to and from f32. Built with -ffp-contract=off
// (CMakeLists.txt): the quantizers round x * id + 0.5 in two f32 steps, as the
// reference does; a fused multiply-add would round some values the other way.
#include "core/block_quants.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/dtype.h"

namespace serval::block_quants {

namespace {

constexpr int kHalf = kBlock / 2;

// The 5-bit value of element j: its nibble and bit j of qh.
inline int five_bit(const uint8_t* qs, uint32_t qh, int j) {
  const int nibble = j < kHalf ? (qs[j] & 0x0f) : (qs[j - kHalf] >> 4);
  return nibble | int((qh >> j) & 1u) << 4;
}

inline uint32_t load_qh(const uint8_t* qh) {
  return uint32_t(qh[0]) | uint32_t(qh[1]) << 8 | uint32_t(qh[2]) << 16 | uint32_t(qh[3]) << 24;
}

inline void store_qh(uint8_t* qh, uint32_t v) {
  for (int i = 0; i < 4; ++i) qh[i] = uint8_t(v >> (8 * i));
}

// Packs 32 quants (each below 32) into nibbles and, where they have one, high bits.
void pack(const uint8_t* q, uint8_t* qs, uint8_t* qh) {
  uint32_t high = 0;
  for (int j = 0; j < kHalf; ++j) qs[j] = uint8_t((q[j] & 0x0f) | (q[j + kHalf] & 0x0f) << 4);
  for (int j = 0; j < kBlock; ++j) high |= uint32_t(q[j] >> 4) << j;
  if (qh) store_qh(qh, high);
}

// Smallest and largest of a block.
void min_max(const float* x, float& lo, float& hi) {
  lo = std::numeric_limits<float>::max();
  hi = -std::numeric_limits<float>::max();
  for (int j = 0; j < kBlock; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
  }
}

// Affine blocks (Q4_1, Q5_1): the minimum is the offset, (max - min) / levels the step.
void quantize_affine(const float* x, int levels, uint16_t& d_out, uint16_t& m_out, uint8_t* q) {
  float lo, hi;
  min_max(x, lo, hi);
  const float d = (hi - lo) / float(levels);
  const float id = d != 0 ? 1.0f / d : 0.0f;
  d_out = f32_to_f16(d);
  m_out = f32_to_f16(lo);
  for (int j = 0; j < kBlock; ++j) q[j] = uint8_t(std::min(levels, int((x[j] - lo) * id + 0.5f)));
}

}  // namespace

void dequantize_q4_1(const void* src, float* dst, int64_t blocks) {
  const auto* b = static_cast<const BlockQ4_1*>(src);
  for (int64_t i = 0; i < blocks; ++i, dst += kBlock) {
    const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
    for (int j = 0; j < kHalf; ++j) {
      dst[j] = float(b[i].qs[j] & 0x0f) * d + m;
      dst[j + kHalf] = float(b[i].qs[j] >> 4) * d + m;
    }
  }
}

void dequantize_q5_0(const void* src, float* dst, int64_t blocks) {
  const auto* b = static_cast<const BlockQ5_0*>(src);
  for (int64_t i = 0; i < blocks; ++i, dst += kBlock) {
    const float d = f16_to_f32(b[i].d);
    const uint32_t qh = load_qh(b[i].qh);
    for (int j = 0; j < kBlock; ++j) dst[j] = float(five_bit(b[i].qs, qh, j) - 16) * d;
  }
}

void dequantize_q5_1(const void* src, float* dst, int64_t blocks) {
  const auto* b = static_cast<const BlockQ5_1*>(src);
  for (int64_t i = 0; i < blocks; ++i, dst += kBlock) {
    const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
    const uint32_t qh = load_qh(b[i].qh);
    for (int j = 0; j < kBlock; ++j) dst[j] = float(five_bit(b[i].qs, qh, j)) * d + m;
  }
}

void quantize_q4_1(const float* src, void* dst, int64_t blocks) {
  auto* b = static_cast<BlockQ4_1*>(dst);
  uint8_t q[kBlock];
  for (int64_t i = 0; i < blocks; ++i, src += kBlock) {
    quantize_affine(src, 15, b[i].d, b[i].m, q);
    pack(q, b[i].qs, nullptr);
  }
}

void quantize_q5_0(const float* src, void* dst, int64_t blocks) {
  auto* b = static_cast<BlockQ5_0*>(dst);
  uint8_t q[kBlock];
  for (int64_t i = 0; i < blocks; ++i, src += kBlock) {
    // The value of largest magnitude maps to -16 exactly; the other sign clamps at 15.
    float amax = 0, max = 0;
    for (int j = 0; j < kBlock; ++j)
      if (std::fabs(src[j]) > amax) { amax = std::fabs(src[j]); max = src[j]; }
    const float d = max / -16.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = f32_to_f16(d);
    for (int j = 0; j < kBlock; ++j) q[j] = uint8_t(std::min(31, int(src[j] * id + 16.5f)));
    pack(q, b[i].qs, b[i].qh);
  }
}

void quantize_q5_1(const float* src, void* dst, int64_t blocks) {
  auto* b = static_cast<BlockQ5_1*>(dst);
  uint8_t q[kBlock];
  for (int64_t i = 0; i < blocks; ++i, src += kBlock) {
    quantize_affine(src, 31, b[i].d, b[i].m, q);
    pack(q, b[i].qs, b[i].qh);
  }
}

}  // namespace serval::block_quants
