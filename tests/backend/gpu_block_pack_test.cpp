// The GPU's packed layout of GGUF blocks (backend/gpu_block_pack.h): every
// weight lands where the packed GEMV reads it and comes back exactly, the
// padding holds zero weights, and widths that are not whole blocks are refused.
#include "backend/gpu_block_pack.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"

namespace serval {
namespace {

std::vector<uint8_t> random_blocks(DType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 0.02f);
  std::vector<float> f(size_t(rows * cols));
  for (float& v : f) v = dist(rng);
  std::vector<uint8_t> blocks(size_t(dtype_bytes(type, rows * cols)));
  from_f32(type, f.data(), blocks.data(), rows * cols);
  return blocks;
}

struct Shape {
  int64_t rows, cols;
};
// One step, a step and a tail, an odd count of groups, rows not a multiple of 8.
const Shape kShapes[] = {{8, 128}, {13, 96}, {3, 160}, {21, 4128}, {1, 32}, {16, 64}};

TEST(GpuBlockPack, EveryWeightComesBackExactly) {
  for (DType type : {DType::Q4_0, DType::Q8_0})
    for (const Shape& s : kShapes) {
      const auto blocks = random_blocks(type, s.rows, s.cols, uint32_t(s.rows * 1000 + s.cols));
      std::vector<float> want(size_t(s.rows * s.cols));
      to_f32(type, blocks.data(), want.data(), s.rows * s.cols);
      const GpuBlockPack pack = GpuBlockPack::of(type, s.rows, s.cols);
      const std::vector<uint8_t> packed = pack_gguf_blocks(pack, type, blocks.data());
      ASSERT_EQ(int64_t(packed.size()), pack.total_bytes());
      EXPECT_EQ(unpack_gpu_blocks(pack, packed.data()), want)
          << dtype_name(type) << " [" << s.rows << ", " << s.cols << "]";
    }
}

TEST(GpuBlockPack, PaddingIsWholeStepsAndUnitsOfZeroWeights) {
  const GpuBlockPack p4 = GpuBlockPack::of(DType::Q4_0, 13, 160);
  EXPECT_EQ(p4.padded_rows, 16);
  EXPECT_EQ(p4.padded_cols, 256);  // 2 steps of 128
  EXPECT_EQ(p4.row_bytes(), 128);
  const GpuBlockPack p8 = GpuBlockPack::of(DType::Q8_0, 13, 160);
  EXPECT_EQ(p8.padded_cols, 192);  // 3 steps of 64
  EXPECT_EQ(p8.row_bytes(), 192);
  for (DType type : {DType::Q4_0, DType::Q8_0}) {
    const GpuBlockPack p = GpuBlockPack::of(type, 13, 160);
    const auto blocks = random_blocks(type, 13, 160, 7);
    const std::vector<uint8_t> packed = pack_gguf_blocks(p, type, blocks.data());
    // The padded matrix read whole: rows 13..15 and columns 160.. are zero.
    GpuBlockPack whole = p;
    whole.rows = p.padded_rows;
    whole.cols = p.padded_cols;
    const std::vector<float> all = unpack_gpu_blocks(whole, packed.data());
    for (int64_t r = 0; r < whole.rows; ++r)
      for (int64_t c = 0; c < whole.cols; ++c)
        if (r >= 13 || c >= 160) {
          ASSERT_EQ(all[size_t(r * whole.cols + c)], 0.f) << "row " << r << " col " << c;
        }
  }
}

TEST(GpuBlockPack, ScalesFillTheirArrayOnce) {
  for (DType type : {DType::Q4_0, DType::Q8_0}) {
    const GpuBlockPack p = GpuBlockPack::of(type, 13, 160);
    std::set<int64_t> seen;
    for (int64_t r = 0; r < p.padded_rows; ++r)
      for (int64_t g = 0; g < p.padded_cols / GpuBlockPack::kGroup; ++g) {
        const int64_t i = p.scale_index(r, g);
        ASSERT_TRUE(i >= 0 && i < p.scale_count()) << r << ", " << g;
        seen.insert(i);
      }
    EXPECT_EQ(int64_t(seen.size()), p.scale_count());
    // A lane's scales: rows 2l and 2l + 1 of its unit, side by side, per group.
    EXPECT_EQ(p.scale_index(3, 0), p.scale_index(2, 0) + 1);
    EXPECT_EQ(p.scale_index(2, 1), p.scale_index(2, 0) + 2);
  }
}

TEST(GpuBlockPack, RefusesWhatItCannotPack) {
  auto error_of = [](DType t, int64_t rows, int64_t cols) {
    try {
      GpuBlockPack::of(t, rows, cols);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of(DType::Q4_0, 4, 48).find("whole blocks of 32 columns"), std::string::npos);
  EXPECT_NE(error_of(DType::BF16, 4, 64).find("bf16 is not a GGUF block type"), std::string::npos);
  EXPECT_NE(error_of(DType::Q8_0, 0, 64).find("[0, 64]"), std::string::npos);
}

}  // namespace
}  // namespace serval
