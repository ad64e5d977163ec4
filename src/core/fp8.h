#pragma once
// The OCP 8-bit floats, decoded exactly to f32 (every value of both is an f32).
//  e4m3 ("e4m3fn", torch.float8_e4m3fn, safetensors F8_E4M3): bias 7, no
//    infinities, S.1111.111 is NaN, largest finite 448; what FP8 checkpoints
//    store and Hopper's tensor cores read.
//  e5m2 (torch.float8_e5m2, safetensors F8_E5M2): bias 15, IEEE-like (the top
//    byte of an f16), with infinities and NaNs.
// NaNs keep their sign and payload, quieted, as PyTorch's conversions do, so
// the results equal torch's bit for bit (tests/core/fp8_test.cpp).
// f32_to_fp8_e4m3 encodes as torch's .to(torch.float8_e4m3fn) does: round to
// nearest, ties to even, saturating (beyond +-448, infinities included, gives
// +-448), NaN -> S.1111.111.
#include <cstdint>

#include "core/dtype.h"

namespace serval {

inline float fp8_e4m3_to_f32(uint8_t b) {
  const uint32_t sign = uint32_t(b & 0x80) << 24;
  const uint32_t exp = (b >> 3) & 0xF, man = b & 0x7;
  if (exp == 0xF && man == 0x7) return f32_from_bits(sign | 0x7f800000u | (man << 20) | 0x400000u);
  if (exp == 0) {  // subnormal: man * 2^-9, exact in f32
    const float v = float(man) * (1.0f / 512.0f);
    return f32_from_bits(sign | bits_from_f32(v));
  }
  return f32_from_bits(sign | ((exp - 7 + 127) << 23) | (man << 20));
}

inline float fp8_e5m2_to_f32(uint8_t b) {
  const uint32_t sign = uint32_t(b & 0x80) << 24;
  const uint32_t exp = (b >> 2) & 0x1F, man = b & 0x3;
  if (exp == 0x1F) return f32_from_bits(sign | 0x7f800000u | (man << 21) | (man ? 0x400000u : 0u));
  if (exp == 0) {  // subnormal: man * 2^-16
    const float v = float(man) * (1.0f / 65536.0f);
    return f32_from_bits(sign | bits_from_f32(v));
  }
  return f32_from_bits(sign | ((exp - 15 + 127) << 23) | (man << 21));
}

inline uint8_t f32_to_fp8_e4m3(float x) {
  const uint32_t bits = bits_from_f32(x);
  const uint8_t sign = uint8_t((bits >> 24) & 0x80);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7f;            // NaN
  if (abs >= 0x43e00000u) return sign | 0x7e;           // >= 448 (infinity too): saturate
  if (abs < 0x3c800000u) {                              // below 2^-6: subnormal steps of 2^-9
    const float steps = f32_from_bits(abs) * 512.0f;    // exact: a power-of-two scale, < 8
    uint32_t q = uint32_t(steps);
    const float rest = steps - float(q);
    if (rest > 0.5f || (rest == 0.5f && (q & 1))) ++q;  // 8 steps is 2^-6, byte 0x08: still right
    return sign | uint8_t(q);
  }
  // Normal: keep 3 of f32's 23 mantissa bits, ties to even; a carry moves
  // into the exponent, and 448 + half a step (464) was saturated above.
  const uint32_t rounded = (abs + 0x7ffffu + ((abs >> 20) & 1)) >> 20;
  return sign | uint8_t(rounded - (120u << 3));  // f32 exponent bias 127 -> e4m3's 7
}

}  // namespace serval
