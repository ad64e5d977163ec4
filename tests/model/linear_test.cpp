// Linear's formats: the reference dequantization of each, checked against
// the formula by hand, and the errors of tensors that do not match a format.
#include "model/linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "test_models.h"

namespace serval {
namespace {

using testing::expect_error;

TensorView view(const std::string& name, DType dt, std::vector<int64_t> shape, const void* data) {
  TensorView v{name, dt, std::move(shape), data, 0};
  v.nbytes = dtype_bytes(dt, v.numel());
  return v;
}

TEST(Linear, DenseAndGgufBlocksDequantizeAsTheirDtype) {
  const std::vector<float> w = {1.5f, -2.0f, 0.25f, 3.0f, 0.0f, -1.0f};
  const Linear d = linear_of(view("w", DType::F32, {2, 3}, w.data()));
  EXPECT_EQ(d.format, LinearFormat::dense(DType::F32));
  EXPECT_EQ(d.format.describe(), "f32");
  EXPECT_TRUE(d.shard.is_whole());
  EXPECT_EQ(dequantize_linear(d), w);

  std::vector<float> row(32);
  for (int i = 0; i < 32; ++i) row[size_t(i)] = float(i - 16) / 4.0f;
  std::vector<uint8_t> q(size_t(dtype_bytes(DType::Q8_0, 32)));
  from_f32(DType::Q8_0, row.data(), q.data(), 32);
  const Linear g = linear_of(view("g", DType::Q8_0, {1, 32}, q.data()));
  EXPECT_EQ(g.format.kind, LinearFormat::Kind::GgufBlock);
  std::vector<float> expect(32);
  to_f32(DType::Q8_0, q.data(), expect.data(), 32);
  EXPECT_EQ(dequantize_linear(g), expect);
}

TEST(Linear, Int8PerChannelIsQuantTimesItsRowsScale) {
  const std::vector<int8_t> q = {-127, 0, 5, 127, 64, -3};
  const std::vector<float> scale = {0.5f, 0.25f};
  Linear w;
  w.name = "blk.0.ffn_down.weight";
  w.out = 2;
  w.in = 3;
  w.format = {LinearFormat::Kind::Int8PerChannel, DType::I8, 0, true};
  w.weight = view("q", DType::I8, {2, 3}, q.data());
  w.scales = view("s", DType::F32, {2}, scale.data());
  EXPECT_EQ(w.format.describe(), "int8 per channel");
  EXPECT_EQ(w.stored_bytes(), 6 + 8);
  EXPECT_EQ(dequantize_linear(w), (std::vector<float>{-63.5f, 0.0f, 2.5f, 31.75f, 16.0f, -0.75f}));

  Linear bad = w;
  bad.scales = view("s", DType::F32, {3}, scale.data());
  expect_error([&] { bad.validate(); }, {"blk.0.ffn_down.weight", "scales", "expected f32 [2]"});
  bad.scales.reset();
  expect_error([&] { bad.validate(); }, {"needs scales"});
}

TEST(Linear, Int4GroupedUnpacksLowNibbleFirstWithZeroPoints) {
  // One row of 4 inputs in groups of 2: bytes 0x21 (q 1, 2) and 0xF0 (q 0, 15).
  const std::vector<uint8_t> packed = {0x21, 0xF0};
  const std::vector<float> scale = {0.5f, 2.0f}, zero = {1.0f, 8.0f};
  Linear w;
  w.name = "w4";
  w.out = 1;
  w.in = 4;
  w.format = {LinearFormat::Kind::Int4Grouped, DType::I8, 2, false};
  w.weight = view("q", DType::I8, {1, 2}, packed.data());
  w.scales = view("s", DType::F32, {1, 2}, scale.data());
  w.zeros = view("z", DType::F32, {1, 2}, zero.data());
  EXPECT_EQ(w.format.describe(), "int4 g2 asym");
  EXPECT_EQ(dequantize_linear(w), (std::vector<float>{0.0f, 0.5f, -16.0f, 14.0f}));
  // Symmetric: the zero point is 8.
  w.format.symmetric = true;
  expect_error([&] { w.validate(); }, {"symmetric has no zero points"});
  w.zeros.reset();
  EXPECT_EQ(dequantize_linear(w), (std::vector<float>{-3.5f, -3.0f, -16.0f, 14.0f}));
  w.format.group_size = 3;
  expect_error([&] { w.validate(); }, {"group size 3", "4 inputs"});
}

TEST(Linear, Fp8E4M3PerTensorAndPerRow) {
  // 0x38 = 1.0, 0xC0 = -2.0, 0x01 = 2^-9 (subnormal), 0x7E = 448 (the largest).
  const std::vector<uint8_t> q = {0x38, 0xC0, 0x01, 0x7E};
  const std::vector<float> one = {0.5f}, rows = {1.0f, 2.0f};
  Linear w;
  w.name = "w8";
  w.out = 2;
  w.in = 2;
  w.format = {LinearFormat::Kind::Fp8, DType::FP8_E4M3, 0, true};
  w.weight = view("q", DType::FP8_E4M3, {2, 2}, q.data());
  w.scales = view("s", DType::F32, {1}, one.data());
  EXPECT_EQ(dequantize_linear(w), (std::vector<float>{0.5f, -1.0f, std::ldexp(0.5f, -9), 224.0f}));
  w.scales = view("s", DType::F32, {2}, rows.data());
  EXPECT_EQ(dequantize_linear(w), (std::vector<float>{1.0f, -2.0f, std::ldexp(2.0f, -9), 896.0f}));
}

TEST(Linear, Fp8E4M3BlockScalesWithPartialBlocks) {
  // [3, 5] of 1.0 (0x38) in blocks of 2 x 2: scales [2, 3], the last row and
  // column of blocks partial.
  const std::vector<uint8_t> q(15, 0x38);
  const std::vector<float> scales = {1, 2, 3, 4, 5, 6};
  Linear w;
  w.name = "w8";
  w.out = 3;
  w.in = 5;
  w.format = {LinearFormat::Kind::Fp8, DType::FP8_E4M3, 0, true, 2, 2};
  w.weight = view("q", DType::FP8_E4M3, {3, 5}, q.data());
  w.scales = view("s", DType::F32, {2, 3}, scales.data());
  EXPECT_EQ(w.format.describe(), "fp8 e4m3 block 2x2");
  EXPECT_EQ(dequantize_linear(w), (std::vector<float>{1, 1, 2, 2, 3,  //
                                                      1, 1, 2, 2, 3,  //
                                                      4, 4, 5, 5, 6}));
  w.scales = view("s", DType::F32, {1, 3}, scales.data());
  expect_error([&] { w.validate(); }, {"block scales", "[1, 3]", "expected f32 [2, 3]"});
}

}  // namespace
}  // namespace serval
