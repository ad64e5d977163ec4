// Q4_1, Q5_0 and Q5_1 against values worked out by hand from GGUF's block
// layouts, and their quantizers' round trips. tests/python/test_gguf_quant_types.py
// checks both directions against the gguf package's reference code.
#include "core/block_quants.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace serval {
namespace {

using block_quants::BlockQ4_1;
using block_quants::BlockQ5_0;
using block_quants::BlockQ5_1;

constexpr uint16_t kHalf = 0x3800, kQuarter = 0x3400, kOne = 0x3c00, kMinusOne = 0xbc00;  // f16 bits

// Nibbles j (low) and 15 - j (high) in byte j: element j is j, element 16 + j is 15 - j.
void fill_nibbles(uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = uint8_t(j | (15 - j) << 4);
}

// Fifth bits: elements 0..3 and 20..23.
void fill_high_bits(uint8_t* qh) {
  const uint8_t bits[4] = {0x0f, 0x00, 0xf0, 0x00};
  std::memcpy(qh, bits, 4);
}

std::vector<float> decode(DType t, const void* block) {
  std::vector<float> out(32);
  to_f32(t, block, out.data(), 32);
  return out;
}

TEST(BlockQuants, Q4_1DecodesAsStepTimesQuantPlusMin) {
  BlockQ4_1 b{kHalf, kMinusOne, {}};  // w = 0.5 q - 1
  fill_nibbles(b.qs);
  const std::vector<float> w = decode(DType::Q4_1, &b);
  EXPECT_EQ(w[0], -1.0f);
  EXPECT_EQ(w[5], 1.5f);
  EXPECT_EQ(w[15], 6.5f);
  EXPECT_EQ(w[16], 6.5f);  // high nibble of byte 0
  EXPECT_EQ(w[20], 4.5f);  // high nibble of byte 4: 11
  EXPECT_EQ(w[31], -1.0f);
}

TEST(BlockQuants, Q5_0DecodesFiveBitsAroundSixteen) {
  BlockQ5_0 b{kQuarter, {}, {}};  // w = 0.25 (q - 16)
  fill_high_bits(b.qh);
  fill_nibbles(b.qs);
  const std::vector<float> w = decode(DType::Q5_0, &b);
  EXPECT_EQ(w[0], 0.0f);     // 0 | 16
  EXPECT_EQ(w[3], 0.75f);    // 3 | 16
  EXPECT_EQ(w[4], -3.0f);    // 4, no fifth bit
  EXPECT_EQ(w[16], -0.25f);  // 15
  EXPECT_EQ(w[20], 2.75f);   // 11 | 16
  EXPECT_EQ(w[31], -4.0f);   // 0
}

TEST(BlockQuants, Q5_1DecodesFiveBitsPlusMin) {
  BlockQ5_1 b{kHalf, kOne, {}, {}};  // w = 0.5 q + 1
  fill_high_bits(b.qh);
  fill_nibbles(b.qs);
  const std::vector<float> w = decode(DType::Q5_1, &b);
  EXPECT_EQ(w[3], 10.5f);  // 19
  EXPECT_EQ(w[4], 3.0f);   // 4
  EXPECT_EQ(w[20], 14.5f); // 27
  EXPECT_EQ(w[31], 1.0f);  // 0
}

TEST(BlockQuants, SizesFollowGguf) {
  EXPECT_EQ(dtype_block_elems(DType::Q4_1), 32);
  EXPECT_EQ(dtype_block_bytes(DType::Q4_1), 20);
  EXPECT_EQ(dtype_block_bytes(DType::Q5_0), 22);
  EXPECT_EQ(dtype_block_bytes(DType::Q5_1), 24);
  EXPECT_EQ(dtype_bytes(DType::Q5_1, 96), 72);
}

TEST(BlockQuants, QuantizersPickTheReferenceCodes) {
  // 0, 1, ..., 31: Q4_1 steps by 31/15 from 0, Q5_1 by exactly 1.
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = float(j);
  BlockQ5_1 b5{};
  from_f32(DType::Q5_1, x, &b5, 32);
  EXPECT_EQ(b5.d, kOne);
  EXPECT_EQ(b5.m, 0);
  EXPECT_EQ(decode(DType::Q5_1, &b5), std::vector<float>(x, x + 32));
  BlockQ4_1 b4{};
  from_f32(DType::Q4_1, x, &b4, 32);
  EXPECT_EQ(b4.qs[1] & 0x0f, 0);  // 1 / (31 / 15) = 0.48 rounds down
  EXPECT_EQ(b4.qs[2] & 0x0f, 1);  // 0.97 rounds up
  EXPECT_EQ(b4.qs[15] >> 4, 15);  // 31 is the top code
  // Q5_0: the largest magnitude (-8) maps to code 0 exactly, so the step is 0.5.
  for (int j = 0; j < 32; ++j) x[j] = j == 7 ? -8.0f : 0.25f * float(j % 8);
  BlockQ5_0 b0{};
  from_f32(DType::Q5_0, x, &b0, 32);
  EXPECT_EQ(b0.d, kHalf);
  const std::vector<float> w = decode(DType::Q5_0, &b0);
  EXPECT_EQ(w[7], -8.0f);
  EXPECT_EQ(w[2], 0.5f);  // 0.5 is on the grid
}

// Element 1 lands at x * id + 16.5 = 29.999999 exactly but 30.0 in two f32
// roundings: the reference (bytes from the gguf package) stores 30, a fused
// multiply-add would store 29 (block_quants.cpp is built without contraction).
TEST(BlockQuants, Q5_0RoundsInTwoStepsAsTheReference) {
  float x[32] = {-0x1.5c59d2p+1f, 0x1.25ebc8p+1f};
  const uint8_t expect[22] = {0x71, 0x31, 0xfe, 0xff, 0xff, 0xff, 0x00, 0x0e};  // then zeros
  uint8_t got[22];
  from_f32(DType::Q5_0, x, got, 32);
  for (int i = 0; i < 22; ++i) EXPECT_EQ(got[i], expect[i]) << "byte " << i;
}

TEST(BlockQuants, ConstantBlocksRoundTripExactly) {
  // Q5_0's constant 3 is 16 steps of -0.1875, exact in f16.
  for (DType t : {DType::Q4_1, DType::Q5_0, DType::Q5_1}) {
    for (float v : {0.0f, 3.0f}) {
      std::vector<float> x(64, v), y(64);
      std::vector<uint8_t> q(size_t(dtype_bytes(t, 64)));
      from_f32(t, x.data(), q.data(), 64);
      to_f32(t, q.data(), y.data(), 64);
      EXPECT_EQ(x, y) << dtype_name(t) << " " << v;
    }
  }
}

TEST(BlockQuants, RoundTripWithinHalfAStep) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.3f, 1.0f);  // off-center: the min matters
  constexpr int kBlocks = 64, n = 32 * kBlocks;
  std::vector<float> x(n), y(n);
  for (auto& v : x) v = nd(rng);
  for (DType t : {DType::Q4_1, DType::Q5_0, DType::Q5_1}) {
    std::vector<uint8_t> q(size_t(dtype_bytes(t, n)));
    from_f32(t, x.data(), q.data(), n);
    to_f32(t, q.data(), y.data(), n);
    for (int b = 0; b < kBlocks; ++b) {
      float lo = x[b * 32], hi = lo, amax = 0;
      for (int j = 0; j < 32; ++j) {
        lo = std::min(lo, x[b * 32 + j]);
        hi = std::max(hi, x[b * 32 + j]);
        amax = std::max(amax, std::fabs(x[b * 32 + j]));
      }
      // Affine types round to half a step (plus the f16 rounding of step and min);
      // Q5_0 maps the largest magnitude to -16, so the other sign may clamp a whole step.
      const float step = t == DType::Q4_1 ? (hi - lo) / 15 : t == DType::Q5_1 ? (hi - lo) / 31 : amax / 16;
      const float tol = (t == DType::Q5_0 ? 1.01f : 0.52f) * step + 1e-3f * std::fabs(lo);
      for (int j = 0; j < 32; ++j)
        ASSERT_NEAR(x[b * 32 + j], y[b * 32 + j], tol) << dtype_name(t) << " block " << b << " element " << j;
    }
  }
}

TEST(BlockQuants, PartialBlocksAreRefused) {
  std::vector<float> x(48);
  std::vector<uint8_t> q(64);
  try {
    from_f32(DType::Q5_1, x.data(), q.data(), 48);
    FAIL() << "48 elements were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q5_1 needs a multiple of 32 elements, got 48"), std::string::npos) << e.what();
  }
  EXPECT_THROW(to_f32(DType::Q4_1, q.data(), x.data(), 48), Error);
}

}  // namespace
}  // namespace serval
