#pragma once
// GGUF's 32-element blocks with a minimum or a fifth bit: Q4_1, Q5_0, Q5_1,
// laid out as in GGUF files (f16 fields little-endian, as on every host we run).
//   Q4_1: d, m (f16), 16 bytes of nibbles;             w = q * d + m,    q in 0..15
//   Q5_0: d (f16), 32 high bits qh, 16 bytes nibbles;  w = (q - 16) * d, q in 0..31
//   Q5_1: d, m (f16), qh, 16 bytes of nibbles;         w = q * d + m,    q in 0..31
// Element j < 16 is the low nibble of byte j, element j >= 16 the high nibble of
// byte j - 16; bit j of qh is element j's fifth bit.
#include <cstdint>

namespace serval::block_quants {

constexpr int kBlock = 32;

struct BlockQ4_1 { uint16_t d, m; uint8_t qs[kBlock / 2]; };
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[kBlock / 2]; };
struct BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[kBlock / 2]; };
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);

// `blocks` blocks at src into blocks * 32 floats at dst.
void dequantize_q4_1(const void* src, float* dst, int64_t blocks);
void dequantize_q5_0(const void* src, float* dst, int64_t blocks);
void dequantize_q5_1(const void* src, float* dst, int64_t blocks);

// blocks * 32 floats into blocks, rounding to nearest as GGUF's reference
// quantizers do (same bytes as the gguf Python package's quantize).
void quantize_q4_1(const float* src, void* dst, int64_t blocks);
void quantize_q5_0(const float* src, void* dst, int64_t blocks);
void quantize_q5_1(const float* src, void* dst, int64_t blocks);

}  // namespace serval::block_quants
