#include "backend/gpu_block_pack.h"

#include <cstring>

#include "core/error.h"

namespace serval {

namespace {

// Where column c of row r lies: the byte, and for Q4_0 the bit of its nibble.
struct QuantSpot {
  int64_t byte;
  int shift;
};
QuantSpot quant_spot(const GpuBlockPack& p, int64_t r, int64_t c) {
  const int64_t step = c / p.step_cols(), in_step = c % p.step_cols();
  const int64_t j = in_step / GpuBlockPack::kGroup, in_group = in_step % GpuBlockPack::kGroup;
  const int64_t lane = in_group / 8, i = in_group % 8;
  const int64_t chunk = r * p.row_bytes() + 16 * (GpuBlockPack::kLanes * step + lane);
  if (p.bits == 4) {
    const int m = int(i / 2);
    const int bit = (i % 2 == 0 ? 0 : 16) + 4 * m;
    return {chunk + 4 * j + bit / 8, bit % 8};
  }
  return {chunk + 4 * (2 * j + i / 4) + i % 4, 0};
}

}  // namespace

GpuBlockPack GpuBlockPack::of(DType type, int64_t rows, int64_t cols) {
  SERVAL_CHECK(packs(type), "gpu block pack: ", dtype_name(type), " is not a GGUF block type the GPU runs packed");
  SERVAL_CHECK(rows > 0 && cols > 0 && cols % kGroup == 0, "gpu block pack: a [", rows, ", ", cols, "] ",
               dtype_name(type), " matrix needs whole blocks of ", kGroup, " columns");
  GpuBlockPack p;
  p.bits = type == DType::Q4_0 ? 4 : 8;
  p.rows = rows;
  p.cols = cols;
  p.padded_rows = (rows + kUnitRows - 1) / kUnitRows * kUnitRows;
  p.padded_cols = (cols + p.step_cols() - 1) / p.step_cols() * p.step_cols();
  return p;
}

int64_t GpuBlockPack::scale_index(int64_t r, int64_t g) const {
  const int64_t u = r / kUnitRows, in_unit = r % kUnitRows;
  const int64_t lane = in_unit / 2, e = in_unit % 2;
  const int64_t s = g / groups_per_step(), j = g % groups_per_step();
  return ((kLanes * (u * steps() + s) + lane) * groups_per_step() + j) * 2 + e;
}

std::vector<uint8_t> pack_gguf_blocks(const GpuBlockPack& p, DType type, const void* blocks) {
  SERVAL_CHECK((type == DType::Q4_0) == (p.bits == 4) && GpuBlockPack::packs(type), "gpu block pack: ",
               dtype_name(type), " blocks for a ", p.bits, "-bit layout");
  std::vector<uint8_t> out(size_t(p.total_bytes()), 0);
  uint8_t* q = out.data();
  // Padding: zero weights (Q4_0 nibble 8, Q8_0 byte 128) under zero scales.
  if (p.bits == 4)
    std::memset(q, 0x88, size_t(p.quant_bytes()));
  else
    std::memset(q, 0x80, size_t(p.quant_bytes()));
  uint16_t* scales = reinterpret_cast<uint16_t*>(q + p.scales_offset());
  const int64_t groups = p.cols / GpuBlockPack::kGroup, block_bytes = dtype_block_bytes(type);
  const auto* src = static_cast<const uint8_t*>(blocks);
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* b = src + (r * groups + g) * block_bytes;
      uint16_t d;
      std::memcpy(&d, b, 2);
      scales[p.scale_index(r, g)] = d;
      for (int e = 0; e < GpuBlockPack::kGroup; ++e) {
        const QuantSpot at = quant_spot(p, r, g * GpuBlockPack::kGroup + e);
        if (p.bits == 4) {
          const uint8_t nib = e < 16 ? b[2 + e] & 15 : b[2 + e - 16] >> 4;
          q[at.byte] = uint8_t((q[at.byte] & ~(15 << at.shift)) | (nib << at.shift));
        } else {
          q[at.byte] = uint8_t(int(int8_t(b[2 + e])) + 128);
        }
      }
    }
  }
  return out;
}

std::vector<float> unpack_gpu_blocks(const GpuBlockPack& p, const uint8_t* packed) {
  const auto* scales = reinterpret_cast<const uint16_t*>(packed + p.scales_offset());
  std::vector<float> out(size_t(p.rows * p.cols));
  for (int64_t r = 0; r < p.rows; ++r)
    for (int64_t c = 0; c < p.cols; ++c) {
      const QuantSpot at = quant_spot(p, r, c);
      const int v = p.bits == 4 ? ((packed[at.byte] >> at.shift) & 15) - 8 : int(packed[at.byte]) - 128;
      out[size_t(r * p.cols + c)] = f16_to_f32(scales[p.scale_index(r, c / GpuBlockPack::kGroup)]) * float(v);
    }
  return out;
}

}  // namespace serval
