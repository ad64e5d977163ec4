#pragma once
// GGUF's K-quants: super-blocks of 256 elements in sub-blocks of 16 or 32, whose
// scales (and mins) are small integers times f16 super-block scales d (and dmin).
// Laid out as in GGUF files:
//   Q2_K (84 bytes):  scales[16] (4-bit scale | 4-bit min << 4), qs[64] (2 bits), d, dmin
//                     16 sub-blocks of 16; w = d * sc * q - dmin * m, q in 0..3
//   Q3_K (110 bytes): hmask[32] (third bits), qs[64] (low 2 bits), scales[12] (16 x 6 bits), d
//                     16 sub-blocks of 16; w = d * (sc - 32) * q, q in -4..3
//   Q4_K (144 bytes): d, dmin, scales[12] (8 scales, 8 mins, 6 bits each), qs[128] (nibbles)
//                     8 sub-blocks of 32; w = d * sc * q - dmin * m, q in 0..15
//   Q5_K (176 bytes): d, dmin, scales[12], qh[32] (fifth bits), qs[128]
//                     8 sub-blocks of 32; w = d * sc * q - dmin * m, q in 0..31
//   Q6_K (210 bytes): ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] (int8), d
//                     16 sub-blocks of 16; w = d * sc * q, q in -32..31
// Where element e's bits lie (k_quants_decode.cpp and k_quants_encode.cpp walk them alike):
//   Q2_K, Q3_K, Q6_K, with e = 128 h + 32 k + l (h < 2, k < 4, l < 32), sub-block e / 16:
//     Q2_K: bits 2k, 2k+1 of qs[32h + l]
//     Q3_K: the same low 2 bits; bit 4h + k of hmask[l] set adds 0, clear subtracts 4
//     Q6_K: nibble k / 2 of ql[64h + 32 (k % 2) + l], bits 2k, 2k+1 of qh[32h + l] above it
//   Q4_K, Q5_K, with e = 64 p + 32 r + l (p < 4, r < 2, l < 32), sub-block s = e / 32:
//     nibble r of qs[32p + l]; Q5_K's fifth bit is bit s of qh[l]
#include <cstdint>

namespace serval::k_quants {

constexpr int kSuper = 256;

struct BlockQ2_K { uint8_t scales[16]; uint8_t qs[64]; uint16_t d, dmin; };
struct BlockQ3_K { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; };
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; };
struct BlockQ5_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
struct BlockQ6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);

// Q4_K and Q5_K: scale and min j (0..7) in the 12 packed bytes. Scales 0..3 are
// the low 6 bits of bytes 0..3 and mins 0..3 of bytes 4..7; scale and min
// j >= 4 take their low 4 bits from byte j + 4 (scale low nibble, min high)
// and their top 2 bits from the spare top bits of bytes j - 4 and j.
inline void scale_min_k4(const uint8_t* s, int j, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0f) | (s[j - 4] >> 6) << 4;
    m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
  }
}
// Writes what scale_min_k4 reads; s must start zeroed.
inline void set_scale_min_k4(uint8_t* s, int j, int sc, int m) {
  if (j < 4) {
    s[j] |= uint8_t(sc);
    s[j + 4] |= uint8_t(m);
  } else {
    s[j + 4] |= uint8_t((sc & 0x0f) | (m & 0x0f) << 4);
    s[j - 4] |= uint8_t((sc >> 4) << 6);
    s[j] |= uint8_t((m >> 4) << 6);
  }
}

// Q3_K: 6-bit scale i (0..15) in the 12 packed bytes (stored with +32). Its low
// 4 bits are the low (i < 8) or high (i >= 8) nibble of byte i % 8, its top
// 2 bits are bits 2 * (i / 4) of byte 8 + i % 4.
inline int scale_q3_k(const uint8_t* s, int i) {
  const int low = i < 8 ? (s[i] & 0x0f) : (s[i - 8] >> 4);
  return low | ((s[8 + i % 4] >> (2 * (i / 4))) & 3) << 4;
}
// Writes what scale_q3_k reads; s must start zeroed.
inline void set_scale_q3_k(uint8_t* s, int i, int v) {
  s[i % 8] |= uint8_t((v & 0x0f) << (i < 8 ? 0 : 4));
  s[8 + i % 4] |= uint8_t((v >> 4) << (2 * (i / 4)));
}

// `blocks` super-blocks at src into blocks * 256 floats at dst.
void dequantize_q2_k(const void* src, float* dst, int64_t blocks);
void dequantize_q3_k(const void* src, float* dst, int64_t blocks);
void dequantize_q4_k(const void* src, float* dst, int64_t blocks);
void dequantize_q5_k(const void* src, float* dst, int64_t blocks);
void dequantize_q6_k(const void* src, float* dst, int64_t blocks);

// blocks * 256 floats into super-blocks: per sub-block scale (and min) from its
// range, rounded to the super-block's grid, then each value to nearest. Simpler
// (and a little less accurate) than llama.cpp's quantizers, which search for
// the scales of least error; any reader decodes the result the same way.
void quantize_q2_k(const float* src, void* dst, int64_t blocks);
void quantize_q3_k(const float* src, void* dst, int64_t blocks);
void quantize_q4_k(const float* src, void* dst, int64_t blocks);
void quantize_q5_k(const float* src, void* dst, int64_t blocks);
void quantize_q6_k(const float* src, void* dst, int64_t blocks);

}  // namespace serval::k_quants
