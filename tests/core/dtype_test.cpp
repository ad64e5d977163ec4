#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace serval {
namespace {

TEST(DType, F16RoundTripsEveryFiniteHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t x = uint16_t(h);
    if ((x & 0x7c00) == 0x7c00) continue;  // inf/nan
    EXPECT_EQ(f32_to_f16(f16_to_f32(x)), x) << std::hex << h;
  }
}

TEST(DType, F16KnownValues) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // ties to even
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x3f808000)), 0x3f80);  // tie, even stays
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x3f818000)), 0x3f82);  // tie, odd rounds up
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
}

TEST(DType, BlockQuantRoundTripWithinStep) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> x(256), y(256);
  for (auto& v : x) v = nd(rng);
  for (DType t : {DType::Q8_0, DType::Q4_0}) {
    std::vector<uint8_t> q(size_t(dtype_bytes(t, 256)));
    from_f32(t, x.data(), q.data(), 256);
    to_f32(t, q.data(), y.data(), 256);
    for (int b = 0; b < 8; ++b) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
      const float step = amax / (t == DType::Q8_0 ? 127.0f : 8.0f);
      // Q4_0 maps the largest magnitude to -8, so the other sign clamps at +7:
      // up to one whole step off there; Q8_0 rounds, half a step.
      const float tol = (t == DType::Q8_0 ? 0.51f : 1.01f) * step + 1e-3f;
      for (int j = 0; j < 32; ++j) EXPECT_NEAR(x[b * 32 + j], y[b * 32 + j], tol);
    }
  }
}

}  // namespace
}  // namespace serval
