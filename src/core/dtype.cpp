#include "core/dtype.h"
#include "core/fp8.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>

#include "core/block_quants.h"
#include "core/error.h"
#include "core/k_quants.h"

namespace serval {

namespace {
constexpr int kQBlock = 32;
struct BlockQ8_0 { uint16_t d; int8_t qs[kQBlock]; };
struct BlockQ4_0 { uint16_t d; uint8_t qs[kQBlock / 2]; };
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_0) == 18);
}  // namespace

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::Q8_0: return "q8_0";
    case DType::Q4_0: return "q4_0";
    case DType::I8: return "i8";
    case DType::I32: return "i32";
    case DType::FP8_E4M3: return "fp8_e4m3";
    case DType::Q4_1: return "q4_1";
    case DType::Q5_0: return "q5_0";
    case DType::Q5_1: return "q5_1";
    case DType::Q2_K: return "q2_k";
    case DType::Q3_K: return "q3_k";
    case DType::Q4_K: return "q4_k";
    case DType::Q5_K: return "q5_k";
    case DType::Q6_K: return "q6_k";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  std::string s(name);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  // The types from_f32 writes.
  constexpr DType kNamed[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0, DType::Q4_0,
                              DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q2_K, DType::Q3_K,
                              DType::Q4_K, DType::Q5_K, DType::Q6_K};
  std::string names;
  for (DType t : kNamed) {
    if (dtype_name(t) == s) return t;
    names += str_cat(names.empty() ? "" : ", ", dtype_name(t));
  }
  fail("unknown dtype \"", name, "\" (expected one of ", names, ")");
}

int64_t dtype_block_elems(DType t) {
  switch (t) {
    case DType::Q8_0: case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: return kQBlock;
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
      return k_quants::kSuper;
    default: return 1;
  }
}

int64_t dtype_block_bytes(DType t) {
  switch (t) {
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: return 2;
    case DType::I8: case DType::FP8_E4M3: return 1;
    case DType::Q8_0: return sizeof(BlockQ8_0);
    case DType::Q4_0: return sizeof(BlockQ4_0);
    case DType::Q4_1: return sizeof(block_quants::BlockQ4_1);
    case DType::Q5_0: return sizeof(block_quants::BlockQ5_0);
    case DType::Q5_1: return sizeof(block_quants::BlockQ5_1);
    case DType::Q2_K: return sizeof(k_quants::BlockQ2_K);
    case DType::Q3_K: return sizeof(k_quants::BlockQ3_K);
    case DType::Q4_K: return sizeof(k_quants::BlockQ4_K);
    case DType::Q5_K: return sizeof(k_quants::BlockQ5_K);
    case DType::Q6_K: return sizeof(k_quants::BlockQ6_K);
  }
  return 0;
}

int64_t dtype_bytes(DType t, int64_t n) {
  const int64_t be = dtype_block_elems(t);
  SERVAL_CHECK(n % be == 0, "a ", dtype_name(t), " tensor needs a multiple of ", be,
               " elements per row, got ", n);
  return n / be * dtype_block_bytes(t);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0) {
    if (mant == 0) return f32_from_bits(sign);
    // Subnormal: renormalize.
    int e = -1;
    do { ++e; mant <<= 1; } while ((mant & 0x400) == 0);
    mant &= 0x3ff;
    return f32_from_bits(sign | uint32_t(127 - 15 - e) << 23 | mant << 13);
  }
  if (exp == 31) return f32_from_bits(sign | 0x7f800000u | mant << 13);
  return f32_from_bits(sign | (exp + 112) << 23 | mant << 13);
}

uint16_t f32_to_f16(float f) {
  const uint32_t x = bits_from_f32(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return uint16_t(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
  if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // rounds to infinity
  if (ax < 0x38800000u) {                                 // subnormal or zero in f16
    const float a = f32_from_bits(ax);
    return uint16_t(sign | uint16_t(std::nearbyint(a * 16777216.0f)));  // a / 2^-24
  }
  uint32_t r = ax - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfff + ((r >> 13) & 1);   // round to nearest even
  return uint16_t(sign | (r >> 13));
}

uint16_t f32_to_bf16(float f) {
  uint32_t x = bits_from_f32(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40);
  x += 0x7fff + ((x >> 16) & 1);
  return uint16_t(x >> 16);
}

void to_f32(DType t, const void* src, float* dst, int64_t n) {
  const int64_t blocks = n / dtype_block_elems(t);
  SERVAL_CHECK(n % dtype_block_elems(t) == 0, "cannot convert ", n, " elements of ", dtype_name(t),
               " to f32: not a whole number of blocks of ", dtype_block_elems(t));
  switch (t) {
    case DType::F32: std::memcpy(dst, src, size_t(n) * 4); return;
    case DType::F16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::BF16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::Q8_0: {
      auto* b = static_cast<const BlockQ8_0*>(src);
      for (int64_t i = 0; i < n / kQBlock; ++i) {
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < kQBlock; ++j) dst[i * kQBlock + j] = d * b[i].qs[j];
      }
      return;
    }
    case DType::Q4_0: {
      auto* b = static_cast<const BlockQ4_0*>(src);
      for (int64_t i = 0; i < n / kQBlock; ++i) {
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < kQBlock / 2; ++j) {
          dst[i * kQBlock + j] = d * (int(b[i].qs[j] & 0x0f) - 8);
          dst[i * kQBlock + j + kQBlock / 2] = d * (int(b[i].qs[j] >> 4) - 8);
        }
      }
      return;
    }
    case DType::I8: {
      auto* s = static_cast<const int8_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = s[i];
      return;
    }
    case DType::I32: {
      auto* s = static_cast<const int32_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = float(s[i]);
      return;
    }
    case DType::Q4_1: block_quants::dequantize_q4_1(src, dst, blocks); return;
    case DType::Q5_0: block_quants::dequantize_q5_0(src, dst, blocks); return;
    case DType::Q5_1: block_quants::dequantize_q5_1(src, dst, blocks); return;
    case DType::Q2_K: k_quants::dequantize_q2_k(src, dst, blocks); return;
    case DType::Q3_K: k_quants::dequantize_q3_k(src, dst, blocks); return;
    case DType::Q4_K: k_quants::dequantize_q4_k(src, dst, blocks); return;
    case DType::Q5_K: k_quants::dequantize_q5_k(src, dst, blocks); return;
    case DType::Q6_K: k_quants::dequantize_q6_k(src, dst, blocks); return;
    case DType::FP8_E4M3: {
      auto* s = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp8_e4m3_to_f32(s[i]);
      return;
    }
  }
  fail("cannot convert ", dtype_name(t), " to f32");
}

void from_f32(DType t, const float* src, void* dst, int64_t n) {
  const int64_t blocks = n / dtype_block_elems(t);
  SERVAL_CHECK(n % dtype_block_elems(t) == 0, dtype_name(t), " needs a multiple of ", dtype_block_elems(t),
               " elements, got ", n);
  switch (t) {
    case DType::F32: std::memcpy(dst, src, size_t(n) * 4); return;
    case DType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::BF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::Q8_0: {
      auto* b = static_cast<BlockQ8_0*>(dst);
      for (int64_t i = 0; i < n / kQBlock; ++i) {
        const float* x = src + i * kQBlock;
        float amax = 0;
        for (int j = 0; j < kQBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        for (int j = 0; j < kQBlock; ++j) b[i].qs[j] = int8_t(std::lround(x[j] * id));
      }
      return;
    }
    case DType::Q4_0: {
      auto* b = static_cast<BlockQ4_0*>(dst);
      for (int64_t i = 0; i < n / kQBlock; ++i) {
        const float* x = src + i * kQBlock;
        float amax = 0, max = 0;  // keep the sign of the largest magnitude
        for (int j = 0; j < kQBlock; ++j)
          if (std::fabs(x[j]) > amax) { amax = std::fabs(x[j]); max = x[j]; }
        const float d = max / -8.0f;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        for (int j = 0; j < kQBlock / 2; ++j) {
          auto q = [&](float v) { return uint8_t(std::min(15, int(v * id + 8.5f))); };
          b[i].qs[j] = uint8_t(q(x[j]) | q(x[j + kQBlock / 2]) << 4);
        }
      }
      return;
    }
    case DType::Q4_1: block_quants::quantize_q4_1(src, dst, blocks); return;
    case DType::Q5_0: block_quants::quantize_q5_0(src, dst, blocks); return;
    case DType::Q5_1: block_quants::quantize_q5_1(src, dst, blocks); return;
    case DType::Q2_K: k_quants::quantize_q2_k(src, dst, blocks); return;
    case DType::Q3_K: k_quants::quantize_q3_k(src, dst, blocks); return;
    case DType::Q4_K: k_quants::quantize_q4_k(src, dst, blocks); return;
    case DType::Q5_K: k_quants::quantize_q5_k(src, dst, blocks); return;
    case DType::Q6_K: k_quants::quantize_q6_k(src, dst, blocks); return;
    default: break;
  }
  fail("cannot convert f32 to ", dtype_name(t));
}

}  // namespace serval
