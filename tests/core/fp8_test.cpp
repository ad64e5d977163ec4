// The FP8 decoders against PyTorch's conversions, bit for bit, for every byte
// (the golden table scripts/gen_fp8_golden.py writes from torch).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/fp8.h"

namespace serval {
namespace {

struct Golden {
  uint8_t byte;
  uint32_t e4m3, e5m2;
};

constexpr Golden kGolden[] = {
#include "fp8_golden.inc"
};

TEST(Fp8, E4M3MatchesTorchBitForBit) {
  static_assert(sizeof(kGolden) / sizeof(kGolden[0]) == 256);
  for (const Golden& g : kGolden)
    EXPECT_EQ(bits_from_f32(fp8_e4m3_to_f32(g.byte)), g.e4m3) << "byte 0x" << std::hex << int(g.byte);
}

TEST(Fp8, E5M2MatchesTorchBitForBit) {
  for (const Golden& g : kGolden)
    EXPECT_EQ(bits_from_f32(fp8_e5m2_to_f32(g.byte)), g.e5m2) << "byte 0x" << std::hex << int(g.byte);
}

TEST(Fp8, ToF32DecodesE4M3Tensors) {
  std::vector<uint8_t> bytes(256);
  for (int i = 0; i < 256; ++i) bytes[size_t(i)] = uint8_t(i);
  std::vector<float> out(256);
  to_f32(DType::FP8_E4M3, bytes.data(), out.data(), 256);
  for (const Golden& g : kGolden) EXPECT_EQ(bits_from_f32(out[g.byte]), g.e4m3) << int(g.byte);
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);   // the largest finite value
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), 0x1p-9f);  // the smallest subnormal
}

}  // namespace
}  // namespace serval
