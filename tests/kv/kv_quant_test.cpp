// The quantized KV cache's element codes (kv/kv_quant.h): value = code *
// scale, codes rounded to nearest even and saturated; the calibration's scale
// formula; --kv-cache-dtype's parsing.
#include "kv/kv_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"

namespace serval {
namespace {

float round_trip(DType t, float x, float scale) { return kv_dequantize(t, kv_quantize(t, x, 1.0f / scale), scale); }

TEST(KvQuant, Int8IsTheNearestCodeTimesTheScaleTiesToEvenSaturated) {
  const float s = 0.0625f;  // a power of two: x / s is exact
  for (int c = -127; c <= 127; ++c) EXPECT_EQ(round_trip(DType::I8, float(c) * s, s), float(c) * s);
  EXPECT_EQ(round_trip(DType::I8, 2.5f * s, s), 2.0f * s);  // ties to even
  EXPECT_EQ(round_trip(DType::I8, 3.5f * s, s), 4.0f * s);
  EXPECT_EQ(round_trip(DType::I8, -2.5f * s, s), -2.0f * s);
  EXPECT_EQ(round_trip(DType::I8, 127.4f * s, s), 127.0f * s);
  EXPECT_EQ(round_trip(DType::I8, 1e9f, s), 127.0f * s);  // saturates, never -128
  EXPECT_EQ(round_trip(DType::I8, -1e9f, s), -127.0f * s);
  EXPECT_EQ(round_trip(DType::I8, INFINITY, s), 127.0f * s);
  EXPECT_EQ(round_trip(DType::I8, NAN, s), 0.0f);
  // Any scale: within half a step inside the range.
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const float scale = 0.0137f;
  for (int i = 0; i < 10000; ++i) {
    const float x = u(rng) * 127.0f * scale;
    EXPECT_LE(std::fabs(round_trip(DType::I8, x, scale) - x), 0.5f * scale * (1 + 1e-5f)) << x;
  }
}

TEST(KvQuant, Fp8IsTheNearestE4m3TimesTheScaleSaturated) {
  const float s = 0.25f;
  for (int b = 0; b < 256; ++b) {
    const float v = fp8_e4m3_to_f32(uint8_t(b));
    if (std::isnan(v)) continue;
    EXPECT_EQ(round_trip(DType::FP8_E4M3, v * s, s), v * s) << b;  // every code comes back exactly
    EXPECT_EQ(kv_quantize(DType::FP8_E4M3, v * s, 1.0f / s), v == 0 ? (b & 0x80 ? 0x80 : 0) : b);
  }
  EXPECT_EQ(round_trip(DType::FP8_E4M3, 1e9f, s), 448.0f * s);
  EXPECT_EQ(round_trip(DType::FP8_E4M3, -500.0f * s, s), -448.0f * s);
  EXPECT_EQ(round_trip(DType::FP8_E4M3, 17.0f * s, s), 16.0f * s);  // ties between 16 and 18, 18 and 20: even mantissas
  EXPECT_EQ(round_trip(DType::FP8_E4M3, 19.0f * s, s), 20.0f * s);
  EXPECT_TRUE(std::isnan(round_trip(DType::FP8_E4M3, NAN, s)));
  // Any scale: 3 mantissa bits, so within 2^-4 relative over the normal range.
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> e(-6.0f, 8.8f);
  const float scale = 0.0137f;
  for (int i = 0; i < 10000; ++i) {
    const float x = std::exp2(e(rng)) * scale * (i % 2 ? 1.0f : -1.0f);
    EXPECT_LE(std::fabs(round_trip(DType::FP8_E4M3, x, scale) - x), std::fabs(x) / 16 * (1 + 1e-5f)) << x;
  }
  // The table the attention decodes rows with is the exact decoding.
  for (int b = 0; b < 256; ++b) {
    const float a = fp8_e4m3_table()[b], want = fp8_e4m3_to_f32(uint8_t(b));
    EXPECT_TRUE(a == want || (std::isnan(a) && std::isnan(want))) << b;
  }
}

TEST(KvQuant, CalibratedScaleIsAmaxTimesMarginOverTheLargestCode) {
  EXPECT_FLOAT_EQ(kv_scale_for_amax(DType::FP8_E4M3, 3.0f), 3.0f * 2.0f / 448.0f);
  EXPECT_FLOAT_EQ(kv_scale_for_amax(DType::I8, 3.0f), 3.0f * 1.25f / 127.0f);
  EXPECT_GT(kv_scale_for_amax(DType::I8, 0.0f), 0.0f);  // an all-zero head still divides
  // The amax itself is representable with room to spare: it does not saturate.
  for (DType t : {DType::FP8_E4M3, DType::I8}) {
    const float s = kv_scale_for_amax(t, 3.0f);
    EXPECT_NEAR(round_trip(t, 3.0f, s), 3.0f, 3.0f / 16);
    EXPECT_LT(kv_quantize(t, 3.0f, 1.0f / s) & 0x7f, 0x7e);
  }
}

TEST(KvQuant, KvCacheDtypeFlagNamesTheAcceptedValues) {
  EXPECT_EQ(parse_kv_cache_dtype("auto", DType::BF16), DType::BF16);
  EXPECT_EQ(parse_kv_cache_dtype("fp8", DType::BF16), DType::FP8_E4M3);
  EXPECT_EQ(parse_kv_cache_dtype("int8", DType::F32), DType::I8);
  try {
    parse_kv_cache_dtype("int4", DType::F32);
    FAIL() << "int4 was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "--kv-cache-dtype must be auto, fp8 or int8, got \"int4\"");
  }
}

}  // namespace
}  // namespace serval
