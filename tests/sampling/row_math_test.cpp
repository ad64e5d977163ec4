#include "sampling/row_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace serval {
namespace {

TEST(RowMath, ExpMatchesLibmOnNonPositiveRange) {
  double worst = 0.0;
  for (float x = 0.0f; x > -87.0f; x -= 0.0137f) {
    const double ref = std::exp(double(x));
    worst = std::max(worst, std::abs(exp_nonpositive(x) - ref) / ref);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(exp_nonpositive(-88.0f), 0.0f);
  EXPECT_EQ(exp_nonpositive(-std::numeric_limits<float>::infinity()), 0.0f);
}

TEST(RowMath, RowMaxFindsLowestIndexAndNaN) {
  std::vector<float> x(100, -1.0f);
  x[40] = 3.0f;
  x[77] = 3.0f;
  RowMax m = row_max(x);
  EXPECT_EQ(m.value, 3.0f);
  EXPECT_EQ(m.index, 40);
  EXPECT_FALSE(m.has_nan);
  x[99] = NAN;
  EXPECT_TRUE(row_max(x).has_nan);
}

TEST(RowMath, ExpShiftedSumsAccurately) {
  std::vector<float> x(100003), out(x.size());
  double ref = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = -float(i % 1000) / 100.0f;
    ref += std::exp(double(x[i]));
  }
  EXPECT_NEAR(exp_shifted(x, 0.0f, out.data()) / ref, 1.0, 1e-6);
  EXPECT_NEAR(sum_exp_shifted(x, 0.0f) / ref, 1.0, 1e-6);
}

TEST(RowMath, DrawIndexFollowsTheCdfAndSkipsZeroWeights) {
  std::vector<float> w(40, 0.0f);
  w[3] = 1.0f;
  w[20] = 2.0f;
  w[35] = 1.0f;
  EXPECT_EQ(draw_index(w, 0.0), 3u);
  EXPECT_EQ(draw_index(w, 0.2499), 3u);
  EXPECT_EQ(draw_index(w, 0.25), 20u);
  EXPECT_EQ(draw_index(w, 0.7499), 20u);
  EXPECT_EQ(draw_index(w, 0.75), 35u);
  EXPECT_EQ(draw_index(w, std::nextafter(1.0, 0.0)), 35u);
}

}  // namespace
}  // namespace serval
