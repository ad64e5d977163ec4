// The FP8 decoders against PyTorch's conversions, bit for bit, for every byte,
// and the e4m3 encoder on a broad set of f32 values (the golden tables
// scripts/gen_fp8_golden.py writes from torch).
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

struct EncodeGolden {
  uint32_t f32;
  uint8_t e4m3;
};

constexpr EncodeGolden kEncodeGolden[] = {
#include "fp8_encode_golden.inc"
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

TEST(Fp8, E4M3EncoderMatchesTorchBitForBit) {
  static_assert(sizeof(kEncodeGolden) / sizeof(kEncodeGolden[0]) > 5000);
  for (const EncodeGolden& g : kEncodeGolden)
    EXPECT_EQ(int(f32_to_fp8_e4m3(f32_from_bits(g.f32))), int(g.e4m3))
        << "f32 " << f32_from_bits(g.f32) << " (bits 0x" << std::hex << g.f32 << ")";
}

TEST(Fp8, E4M3EncoderInvertsTheDecoder) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;  // NaN
    EXPECT_EQ(int(f32_to_fp8_e4m3(fp8_e4m3_to_f32(uint8_t(b)))), b);
  }
  EXPECT_EQ(f32_to_fp8_e4m3(1e9f), 0x7e);   // saturates
  EXPECT_EQ(f32_to_fp8_e4m3(-1e9f), 0xfe);
}

}  // namespace
}  // namespace serval
