// Round-to-nearest int4 (model/rtn_quantize.h): every asymmetric group's
// min..max is representable, so every weight comes back within half a step;
// a group of one sign spans its own min..max (no codes spent on 0), a group
// stretched by an outlier keeps 0 exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "model/rtn_quantize.h"

namespace serval {
namespace {

using Kind = LinearFormat::Kind;

// Dequantizes one row of [groups * g] weights quantized asymmetric with group g
// and checks each weight, min and max included, against half its group's step;
// the groups `exact_range` lists must take the step (max - min) / 15.
RtnMatrix expect_within_half_step(const std::vector<float>& w, int64_t g, const std::vector<int64_t>& exact_range) {
  const LinearFormat f{Kind::Int4Grouped, DType::I8, int(g), false};
  const int64_t in = int64_t(w.size());
  RtnMatrix m = quantize_matrix_rtn(f, "t", w.data(), 1, in);
  const std::vector<float> back = dequantize_linear(m.linear);
  for (int64_t k = 0; k < in / g; ++k) {
    const auto [lo, hi] = std::minmax_element(w.begin() + k * g, w.begin() + (k + 1) * g);
    const float step = m.scales[size_t(k)];
    if (std::find(exact_range.begin(), exact_range.end(), k) != exact_range.end())
      EXPECT_NEAR(step, (*hi - *lo) / 15.0f, 1e-6f * std::fabs(*hi)) << "group " << k;
    for (int64_t i = k * g; i < (k + 1) * g; ++i)
      EXPECT_LE(std::fabs(back[size_t(i)] - w[size_t(i)]), 0.5f * step * (1 + 1e-5f) + 1e-7f)
          << "group " << k << " column " << i << ": " << w[size_t(i)] << " came back as " << back[size_t(i)];
  }
  return m;
}

TEST(RtnInt4, AsymmetricGroupsOfOneSignRoundTripWithinHalfAStep) {
  std::mt19937 rng(52);
  std::uniform_real_distribution<float> u(0.5f, 2.0f);
  std::vector<float> w(4 * 32);
  for (int64_t i = 0; i < 32; ++i) w[size_t(i)] = u(rng);                // all positive, far from 0
  for (int64_t i = 32; i < 64; ++i) w[size_t(i)] = -u(rng);              // all negative
  for (int64_t i = 64; i < 96; ++i) w[size_t(i)] = 1000.0f + u(rng);     // positive, narrow range far from 0
  for (int64_t i = 96; i < 128; ++i) w[size_t(i)] = u(rng) - 1.25f;      // both signs
  expect_within_half_step(w, 32, {0, 1, 2});  // one sign: every code spent on min..max, none on 0
}

// A group stretched by one outlier keeps 0 on its grid: its many small
// weights round to 0 instead of all to the code nearest below them.
TEST(RtnInt4, AsymmetricGroupWithAnOutlierKeepsZeroExact) {
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.0f, 0.05f);
  std::vector<float> w(64);
  for (float& v : w) v = n(rng);
  w[5] = 10.0f;
  w[40] = 0.0f;
  const RtnMatrix m = expect_within_half_step(w, 64, {});
  EXPECT_EQ(dequantize_linear(m.linear)[40], 0.0f);
  EXPECT_EQ(m.zeros[0], std::nearbyint(m.zeros[0]));
}

TEST(RtnInt4, AsymmetricGroupOfOneValueIsExact) {
  for (const float v : {0.0f, 0.75f, -3.5f}) {
    const std::vector<float> w(16, v);
    const RtnMatrix m = quantize_matrix_rtn({Kind::Int4Grouped, DType::I8, 16, false}, "t", w.data(), 1, 16);
    for (const float b : dequantize_linear(m.linear)) EXPECT_EQ(b, v);
  }
}

}  // namespace
}  // namespace serval
