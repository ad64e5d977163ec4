#include "sampling/rng.h"

#include <gtest/gtest.h>

#include <set>

#include "sampling/philox.h"

namespace serval {
namespace {

// Reference values from numpy 2.4's Philox bit generator (numpy.random.Philox,
// Philox4x64-10). numpy increments the counter before each block, so its first
// four outputs for counter=0 are the block of counter {1, 0, 0, 0}:
//   Philox(key=0, counter=0).random_raw(4)
//   Philox(key=[0x0123456789abcdef, 0], counter=0).random_raw(4)
//   Philox(key=[2**64-1]*2, counter=[2**64-1]*4).random_raw(4)  (counter wraps to 0)
TEST(Philox, MatchesNumpyPhilox4x64) {
  EXPECT_EQ(philox4x64_10({1, 0, 0, 0}, {0, 0}),
            (PhiloxCounter{0x02f4ba6408e4d89bull, 0x3dd62b0b9ca8c5b2ull, 0x1c8667a55d902e79ull,
                           0x907d7a052fd5b4dcull}));
  EXPECT_EQ(philox4x64_10({2, 0, 0, 0}, {0, 0}),
            (PhiloxCounter{0x809bf322883987c3ull, 0x471128b9e807f7ddull, 0xf250ba0dbec065b7ull,
                           0xfc6ed66767a457bcull}));
  EXPECT_EQ(philox4x64_10({1, 0, 0, 0}, {0x0123456789abcdefull, 0}),
            (PhiloxCounter{0xdaf0bdc754a0b959ull, 0x38123d82f9ce12cfull, 0x26cf92e903faab88ull,
                           0x1c243f1f4212c6adull}));
  EXPECT_EQ(philox4x64_10({0, 0, 0, 0}, {~0ull, ~0ull}),
            (PhiloxCounter{0x44b7493d1acfc229ull, 0x6636af8e997921ddull, 0x3f73e132b5b3780eull,
                           0x605644dde03b01b1ull}));
}

TEST(Rng, StreamIsPhiloxKeyedBySeed) {
  Rng rng(0x0123456789abcdefull);
  const PhiloxCounter first = philox4x64_10({0, 0, 0, 0}, {0x0123456789abcdefull, 0});
  const PhiloxCounter second = philox4x64_10({1, 0, 0, 0}, {0x0123456789abcdefull, 0});
  for (uint64_t w : first) EXPECT_EQ(rng.next_u64(), w);
  for (uint64_t w : second) EXPECT_EQ(rng.next_u64(), w);
}

TEST(Rng, SameSeedSameStreamDifferentSeedDifferentStream) {
  Rng a(42), b(42), c(43);
  int differ = 0;
  for (int i = 0; i < 100; ++i) {
    const uint64_t x = a.next_u64();
    EXPECT_EQ(x, b.next_u64());
    differ += x != c.next_u64();
  }
  EXPECT_EQ(differ, 100);
}

TEST(Rng, UniformIsInUnitIntervalWithMeanOneHalf) {
  Rng rng(7);
  double sum = 0.0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const double u = rng.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  // Standard error of the mean is sqrt(1/12/n) ~ 0.0009; 5 sigma.
  EXPECT_NEAR(sum / n, 0.5, 0.0046);
}

TEST(Rng, RandomSeedsAreDistinct) {
  std::set<uint64_t> seen;
  for (int i = 0; i < 1000; ++i) seen.insert(random_seed());
  EXPECT_EQ(seen.size(), 1000u);
}

}  // namespace
}  // namespace serval
