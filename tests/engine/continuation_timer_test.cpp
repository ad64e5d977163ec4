#include "engine/continuation_timer.h"

#include <gtest/gtest.h>

namespace serval {
namespace {

using Clock = ContinuationTimer::Clock;
using std::chrono::microseconds;
using std::chrono::milliseconds;

const Clock::time_point t0 = Clock::time_point{} + std::chrono::hours(1);

TEST(ContinuationTimer, StartsAtOnceUntilTwoStepsOfTheSameSizeAreTimed) {
  ContinuationTimer t;
  EXPECT_FALSE(t.start_time(t0, 64));
  t.step_done(t0, 64, t0 + milliseconds(6), /*waited=*/false, /*delayed=*/false);
  EXPECT_FALSE(t.start_time(t0, 64)) << "a step that did not keep the host waiting says nothing of its time";
  t.step_done(t0, 64, t0 + milliseconds(6), true, false);
  EXPECT_FALSE(t.start_time(t0, 64)) << "one step may be a cold start";
  t.step_done(t0, 64, t0 + milliseconds(6), true, false);
  ASSERT_TRUE(t.start_time(t0, 64));
  EXPECT_FALSE(t.start_time(t0, 128)) << "another size class";
  EXPECT_FALSE(t.start_time(t0, 32));
  EXPECT_TRUE(t.start_time(t0, 127)) << "64..127 tokens share a class";
}

TEST(ContinuationTimer, StartsTheHostsCostAndAMarginBeforeTheExpectedEnd) {
  ContinuationTimer t;
  for (int i = 0; i < 50; ++i) {
    const Clock::time_point s = t0 + milliseconds(10 * i);
    t.step_done(s, 1, s + microseconds(4000), true, true);
  }
  t.host_cost(microseconds(200));
  ASSERT_TRUE(t.expected(1));
  const double expected_us = std::chrono::duration<double, std::micro>(*t.expected(1)).count();
  EXPECT_NEAR(expected_us, 4000, 1);
  // Steady steps: the margin is twice the host's cost and the wake-up allowance.
  const double margin_us = std::chrono::duration<double, std::micro>(t.margin(1)).count();
  EXPECT_GT(margin_us, 400);
  EXPECT_LT(margin_us, 600);
  const Clock::time_point at = *t.start_time(t0, 1);
  EXPECT_EQ(at, t0 + *t.expected(1) - t.margin(1));
}

TEST(ContinuationTimer, ExpectsTheShortestOfTheLastSteps) {
  ContinuationTimer t;
  // A cold first step (plans, buffers) must not hold the next starts back.
  t.step_done(t0, 2048, t0 + milliseconds(300), true, false);
  t.step_done(t0, 2048, t0 + milliseconds(44), true, false);
  EXPECT_EQ(*t.expected(2048), milliseconds(44));
  // Nor long steps once the steps get shorter (contexts that ended).
  for (int i = 0; i < 6; ++i) t.step_done(t0, 1, t0 + milliseconds(20), true, true);
  t.step_done(t0, 1, t0 + milliseconds(5), true, true);
  EXPECT_EQ(*t.expected(1), milliseconds(5));
  // Four steps later the short one has left the window.
  for (int i = 0; i < 4; ++i) t.step_done(t0, 1, t0 + milliseconds(21), true, true);
  EXPECT_EQ(*t.expected(1), milliseconds(21));
}

TEST(ContinuationTimer, VaryingStepsAndMissesWidenTheMargin) {
  ContinuationTimer steady, varying;
  for (int i = 0; i < 40; ++i) {
    const Clock::time_point s = t0 + milliseconds(20 * i);
    steady.step_done(s, 8, s + microseconds(5000), true, true);
    varying.step_done(s, 8, s + microseconds(i % 2 ? 4000 : 6000), true, true);
  }
  EXPECT_GT(varying.margin(8), steady.margin(8) + microseconds(2000));
  const Clock::duration before = steady.margin(8);
  steady.step_done(t0, 8, t0 + microseconds(100), /*waited=*/false, /*delayed=*/true);
  EXPECT_EQ(steady.misses(), 1);
  EXPECT_GT(steady.margin(8), before);
  // Not delayed: the device was never left waiting for the host's plan.
  const Clock::duration after = steady.margin(8);
  steady.step_done(t0, 8, t0 + microseconds(100), false, false);
  EXPECT_EQ(steady.misses(), 1);
  EXPECT_EQ(steady.margin(8), after);
}

}  // namespace
}  // namespace serval
