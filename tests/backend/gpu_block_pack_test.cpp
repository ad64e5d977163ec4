// The GPU's packed layout of quantized weights (backend/gpu_block_pack.h):
// every weight lands where the packed GEMV reads it and comes back as the
// format's CPU dequantization (exactly for Q4_0, Q8_0, Q4_1, Int8PerChannel
// and Int4 with f16 scales; within the documented f16 rounding of the scales
// and mins otherwise), the padding holds zero weights, and widths that are not
// whole blocks are refused.
#include "backend/gpu_block_pack.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/k_quants.h"
#include "model/linear.h"
#include "model/rtn_quantize.h"

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
  std::vector<GpuBlockPack> packs = {GpuBlockPack::of(DType::Q4_0, 13, 160), GpuBlockPack::of(DType::Q8_0, 13, 160)};
  for (int g : {64, 128}) {
    LinearFormat f{LinearFormat::Kind::Int4Grouped, DType::F32, g, false};
    packs.push_back(GpuBlockPack::of(f, 13, 3 * 128));
  }
  for (const GpuBlockPack& p : packs) {
    std::set<int64_t> seen;
    for (int64_t r = 0; r < p.padded_rows; ++r)
      for (int64_t g = 0; g < p.padded_cols / p.group; ++g) {
        const int64_t i = p.scale_index(r, g);
        ASSERT_TRUE(i >= 0 && i < p.scale_count()) << r << ", " << g;
        seen.insert(i);
      }
    EXPECT_EQ(int64_t(seen.size()), p.scale_count());
    // A lane's scales: rows 2l and 2l + 1 of its unit, side by side, per group.
    EXPECT_EQ(p.scale_index(3, 0), p.scale_index(2, 0) + 1);
    EXPECT_EQ(p.scale_index(2, 1), p.scale_index(2, 0) + 2 * (p.groups_per_step() > 1 ? 1 : 4));
  }
  // g128: one scale per row and 128 columns, not per 32.
  EXPECT_EQ(packs.back().scale_count(), 16 * 3);
  EXPECT_EQ(packs.back().scale_bytes(), 16 * 3 * 2);
  // Q4_0 and Q8_0 keep their layout byte for byte: quants, then scales at a 256-byte boundary.
  EXPECT_EQ(packs[0].total_bytes(), 16 * 128 + 16 * 8 * 2);
  EXPECT_EQ(packs[1].total_bytes(), 16 * 192 + 16 * 6 * 2);
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


// Half an f16 ulp of v (round to nearest): 2^-11 relative, 2^-25 absolute
// below f16's normal range (gpu_block_pack.h's bound on a rounded d or m).
double half_f16_ulp(double v) { return std::max(std::fabs(v) * std::ldexp(1.0, -11), std::ldexp(1.0, -25)); }

std::vector<float> random_weights(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 0.02f);
  std::vector<float> f(static_cast<size_t>(n));
  for (float& v : f) v = dist(rng);
  return f;
}

// Shapes per group size: one step, odd group counts, widths padded to a whole
// k-step (4-bit: 128 columns), rows not a multiple of 8.
std::vector<Shape> shapes_for(int64_t group) {
  return {{8, 128}, {13, 3 * group}, {3, 5 * group}, {1, group}, {21, 33 * group}};
}

TEST(GpuBlockPack, Q4_1ComesBackExactly) {
  for (const Shape& s : kShapes) {
    const auto blocks = random_blocks(DType::Q4_1, s.rows, s.cols, uint32_t(s.rows * 7 + s.cols));
    std::vector<float> want(size_t(s.rows * s.cols));
    to_f32(DType::Q4_1, blocks.data(), want.data(), s.rows * s.cols);
    const GpuBlockPack pack = GpuBlockPack::of(DType::Q4_1, s.rows, s.cols);
    EXPECT_TRUE(pack.mins && pack.bits == 4 && pack.group == 32);
    const std::vector<uint8_t> packed = pack_gguf_blocks(pack, DType::Q4_1, blocks.data());
    ASSERT_EQ(int64_t(packed.size()), pack.total_bytes());
    EXPECT_EQ(unpack_gpu_blocks(pack, packed.data()), want) << "q4_1 [" << s.rows << ", " << s.cols << "]";
  }
}

// Q4_K (4-bit) and Q5_K (8-bit, the 5-bit quant as the byte), each 32-column
// sub-block's d * sc and dmin * m rounded to f16: each weight within
// n * ulp(d * sc) / 2 + ulp(dmin * m) / 2 of to_f32 (and both f32 roundings).
TEST(GpuBlockPack, KQuantsComeBackWithinTheirF16Rounding) {
  for (DType type : {DType::Q4_K, DType::Q5_K})
    for (const Shape& s : {Shape{8, 256}, Shape{13, 768}, Shape{3, 1280}, Shape{1, 4096}}) {
      const int64_t n = s.rows * s.cols;
      const auto blocks = random_blocks(type, s.rows, s.cols, uint32_t(n));
      std::vector<float> want(static_cast<size_t>(n));
      to_f32(type, blocks.data(), want.data(), n);
      const GpuBlockPack pack = GpuBlockPack::of(type, s.rows, s.cols);
      EXPECT_EQ(pack.bits, type == DType::Q4_K ? 4 : 8);
      EXPECT_TRUE(pack.mins);
      const std::vector<uint8_t> packed = pack_linear(
          pack, linear_of(TensorView{"w", type, {s.rows, s.cols}, blocks.data(), int64_t(blocks.size())}));
      const std::vector<float> got = unpack_gpu_blocks(pack, packed.data());
      const int64_t bb = dtype_block_bytes(type);
      int inexact = 0;
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t* b = blocks.data() + (i / 256) * bb;
        uint16_t dh, mh;
        std::memcpy(&dh, b, 2);
        std::memcpy(&mh, b + 2, 2);
        int sc, m;
        k_quants::scale_min_k4(b + 4, int(i % 256 / 32), sc, m);
        const double d = double(f16_to_f32(dh)) * sc, mn = double(f16_to_f32(mh)) * m;
        const double q = (double(want[size_t(i)]) + mn) / (d > 0 ? d : 1);  // the quant, 0..31
        const double tol = std::round(q) * half_f16_ulp(d) + half_f16_ulp(mn) +
                           2 * std::ldexp(std::fabs(want[size_t(i)]) + d * 32 + mn, -24);
        inexact += got[size_t(i)] != want[size_t(i)];
        ASSERT_LE(std::fabs(double(got[size_t(i)]) - want[size_t(i)]), tol)
            << dtype_name(type) << " [" << s.rows << ", " << s.cols << "] weight " << i;
      }
      std::printf("[gpu pack %s] [%ld, %ld]: %d of %ld weights differ (within the f16 rounding)\n",
                  std::string(dtype_name(type)).c_str(), long(s.rows), long(s.cols), inexact, long(n));
    }
}

// Int4Grouped, every group size the pack takes, symmetric and not: one scale
// (and min) per group of G columns; each weight within the f16 rounding of
// its d and m of dequantize_linear, and exactly it where the f32 scales are
// f16 values (as GPTQ/AWQ checkpoints store them) and symmetric.
TEST(GpuBlockPack, Int4GroupedComesBackAsDequantizeLinear) {
  for (int group : {32, 64, 128})
    for (bool sym : {true, false})
      for (bool f16_scales : {false, true})
        for (const Shape& s : shapes_for(group)) {
          const LinearFormat f{LinearFormat::Kind::Int4Grouped, DType::F32, group, sym};
          const auto w = random_weights(s.rows * s.cols, uint32_t(group + s.rows + s.cols));
          RtnMatrix m = quantize_matrix_rtn(f, "w", w.data(), s.rows, s.cols);
          if (f16_scales)
            for (float& v : m.scales) v = f16_to_f32(f32_to_f16(v));
          const std::vector<float> want = dequantize_linear(m.linear);
          const GpuBlockPack pack = GpuBlockPack::of(f, s.rows, s.cols);
          EXPECT_EQ(pack.group, group);
          EXPECT_EQ(pack.mins, !sym);
          EXPECT_EQ(pack.scale_count(), pack.padded_rows * pack.padded_cols / group);
          const std::vector<uint8_t> packed = pack_linear(pack, m.linear);
          ASSERT_EQ(int64_t(packed.size()), pack.total_bytes());
          const std::vector<float> got = unpack_gpu_blocks(pack, packed.data());
          const std::string what = f.describe() + " [" + std::to_string(s.rows) + ", " + std::to_string(s.cols) + "]";
          if (sym && f16_scales) {
            EXPECT_EQ(got, want) << what;
            continue;
          }
          for (int64_t i = 0; i < s.rows * s.cols; ++i) {
            const int64_t gi = (i / s.cols) * (s.cols / group) + (i % s.cols) / group;
            const double sc = m.scales[size_t(gi)], z = sym ? 8.0 : m.zeros[size_t(gi)];
            const double q = std::round(double(want[size_t(i)]) / sc + z);
            const double tol = (sym ? std::fabs(q - 8) : q) * half_f16_ulp(sc) + (sym ? 0 : half_f16_ulp(sc * z)) +
                               2 * std::ldexp(std::fabs(want[size_t(i)]) + std::fabs(sc) * 16 * (1 + z), -24);
            ASSERT_LE(std::fabs(double(got[size_t(i)]) - want[size_t(i)]), tol) << what << " weight " << i;
          }
        }
}

TEST(GpuBlockPack, Int8PerChannelComesBackExactlyWithRowScales) {
  const LinearFormat f{LinearFormat::Kind::Int8PerChannel, DType::F32, 0, true};
  for (const Shape& s : {Shape{8, 64}, Shape{13, 96}, Shape{3, 160}, Shape{21, 4128}, Shape{1, 32}}) {
    const auto w = random_weights(s.rows * s.cols, uint32_t(s.rows * 3 + s.cols));
    const RtnMatrix m = quantize_matrix_rtn(f, "w", w.data(), s.rows, s.cols);
    const GpuBlockPack pack = GpuBlockPack::of(f, s.rows, s.cols);
    EXPECT_TRUE(pack.row_scale && pack.bits == 8 && !pack.mins);
    EXPECT_EQ(pack.scale_bytes(), pack.padded_rows * 4);
    const std::vector<uint8_t> packed = pack_linear(pack, m.linear);
    ASSERT_EQ(int64_t(packed.size()), pack.total_bytes());
    EXPECT_EQ(unpack_gpu_blocks(pack, packed.data()), dequantize_linear(m.linear))
        << "int8 [" << s.rows << ", " << s.cols << "]";
  }
}

// The padding of every new form holds zero weights (zero scales and mins).
TEST(GpuBlockPack, PaddingOfEveryFormIsZero) {
  const LinearFormat i4{LinearFormat::Kind::Int4Grouped, DType::F32, 64, false};
  const LinearFormat i8{LinearFormat::Kind::Int8PerChannel, DType::F32, 0, true};
  for (const LinearFormat& f : {i4, i8}) {
    const int64_t rows = 13, cols = 192;
    const auto w = random_weights(rows * cols, 5);
    const RtnMatrix m = quantize_matrix_rtn(f, "w", w.data(), rows, cols);
    const GpuBlockPack p = GpuBlockPack::of(f, rows, cols);
    const std::vector<uint8_t> packed = pack_linear(p, m.linear);
    GpuBlockPack whole = p;
    whole.rows = p.padded_rows;
    whole.cols = p.padded_cols;
    const std::vector<float> all = unpack_gpu_blocks(whole, packed.data());
    EXPECT_EQ(whole.cols, f.kind == LinearFormat::Kind::Int4Grouped ? 256 : 192);
    for (int64_t r = 0; r < whole.rows; ++r)
      for (int64_t c = 0; c < whole.cols; ++c)
        if (r >= rows || c >= cols) {
          ASSERT_EQ(all[size_t(r * whole.cols + c)], 0.f) << f.describe() << " row " << r << " col " << c;
        }
  }
}

TEST(GpuBlockPack, RefusesLinearsItCannotPack) {
  auto error_of = [](const LinearFormat& f, int64_t rows, int64_t cols) {
    try {
      GpuBlockPack::of(f, rows, cols);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const LinearFormat g16{LinearFormat::Kind::Int4Grouped, DType::F32, 16, true};
  const LinearFormat i8{LinearFormat::Kind::Int8PerChannel, DType::F32, 0, true};
  const LinearFormat fp8{LinearFormat::Kind::Fp8, DType::F32, 0, true};
  EXPECT_FALSE(GpuBlockPack::packs(g16));
  EXPECT_FALSE(GpuBlockPack::packs(fp8));
  EXPECT_FALSE(GpuBlockPack::packs(DType::Q6_K));
  EXPECT_TRUE(GpuBlockPack::packs(i8));
  EXPECT_NE(error_of(g16, 4, 64).find("int4 g16 sym is not a format"), std::string::npos);
  // stories260K's FFN (172 wide) in int8: not whole groups of 32 columns.
  EXPECT_NE(error_of(i8, 4, 172).find("[4, 172] int8 per channel matrix needs whole groups of 32"), std::string::npos);
  EXPECT_NE(error_of(LinearFormat::of_dtype(DType::Q4_K), 4, 128).find("whole blocks of 256"), std::string::npos);
  // An f32 scale past f16's range cannot be packed: refused naming the tensor, row and group.
  const LinearFormat i4{LinearFormat::Kind::Int4Grouped, DType::F32, 32, true};
  std::vector<float> w(2 * 64, 1.f);
  w[64 + 40] = 1e6f;
  const RtnMatrix m = quantize_matrix_rtn(i4, "blk.0.ffn_up.weight", w.data(), 2, 64);
  try {
    pack_linear(GpuBlockPack::of(i4, 2, 64), m.linear);
    ADD_FAILURE() << "a scale of 1e6 / 7 was packed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"blk.0.ffn_up.weight\" row 1 group 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace serval
