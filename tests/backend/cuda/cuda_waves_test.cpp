// The W tile widths CUTLASS's swapped decode kernel takes (cuda_waves.h), on
// the H100's and H200's 132 SMs. Needs no GPU.
#include "backend/cuda/cuda_waves.h"

#include <gtest/gtest.h>

namespace serval::cuda {

TEST(CudaWaves, FillIsTheShareOfTheWavesSlotsTaken) {
  EXPECT_DOUBLE_EQ(wave_fill(132, 132), 1.0);
  EXPECT_DOUBLE_EQ(wave_fill(264, 132), 1.0);
  EXPECT_DOUBLE_EQ(wave_fill(192, 132), 192.0 / 264.0);  // 7B q/k/v in tiles of 64: 1.45 waves
  EXPECT_DOUBLE_EQ(wave_fill(66, 132), 0.5);
  EXPECT_DOUBLE_EQ(wave_fill(0, 132), 0.0);
  EXPECT_DOUBLE_EQ(wave_fill(10, 0), 0.0);
}

TEST(CudaWaves, BestWTileFillsTheWaves) {
  constexpr int kSms = 132;
  const auto widths = {64, 96, 48};
  EXPECT_EQ(best_w_tile(12288, 1, kSms, widths), 96);  // 7B q/k/v: 128 tiles, one wave
  EXPECT_EQ(best_w_tile(6144, 1, kSms, widths), 48);   // 8B q/k/v: 128 tiles
  EXPECT_EQ(best_w_tile(4096, 2, kSms, widths), 64);   // o or down split in two: 128 tiles
  EXPECT_EQ(best_w_tile(32000, 1, kSms, widths), 64);  // 7B logits: 500 tiles in 4 waves
  EXPECT_EQ(best_w_tile(1000, 1, kSms, widths), 48);   // under a wave: the most tiles
  // Equal fills keep the first listed: 11008 rows are 172 tiles of 64 (0.65),
  // 115 of 96 (0.87) and 230 of 48 (0.87).
  EXPECT_EQ(best_w_tile(11008, 1, kSms, widths), 96);
  EXPECT_EQ(best_w_tile(11008, 1, kSms, {64, 48, 96}), 48);
}

}  // namespace serval::cuda
