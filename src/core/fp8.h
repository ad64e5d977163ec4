#pragma once
// The OCP 8-bit floats, decoded exactly to f32 (every value of both is an f32).
//  e4m3 ("e4m3fn", torch.float8_e4m3fn, safetensors F8_E4M3): bias 7, no
//    infinities, S.1111.111 is NaN, largest finite 448; what FP8 checkpoints
//    store and Hopper's tensor cores read.
//  e5m2 (torch.float8_e5m2, safetensors F8_E5M2): bias 15, IEEE-like (the top
//    byte of an f16), with infinities and NaNs.
// NaNs keep their sign and payload, quieted, as PyTorch's conversions do, so
// the results equal torch's bit for bit (tests/core/fp8_test.cpp).
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

}  // namespace serval
