#include "backend/gpu_block_pack.h"

#include <cstring>

#include "backend/gpu_block_pack_writer.h"
#include "core/error.h"
#include "model/linear.h"

namespace serval {

namespace {

// Where column c of row r lies: the byte, and for 4 bits the bit of its nibble.
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

// GGUF types the pack takes: bits, and whether they have mins.
struct GgufForm {
  int bits;
  bool mins;
  int64_t block;  // columns per GGUF block
};
bool gguf_form(DType t, GgufForm& f) {
  switch (t) {
    case DType::Q4_0: f = {4, false, 32}; return true;
    case DType::Q8_0: f = {8, false, 32}; return true;
    case DType::Q4_1: f = {4, true, 32}; return true;
    case DType::Q4_K: f = {4, true, 256}; return true;
    case DType::Q5_K: f = {8, true, 256}; return true;
    default: return false;
  }
}

GpuBlockPack layout(int bits, int group, bool mins, bool row_scale, int64_t rows, int64_t cols) {
  GpuBlockPack p;
  p.bits = bits;
  p.group = group;
  p.mins = mins;
  p.row_scale = row_scale;
  p.rows = rows;
  p.cols = cols;
  p.padded_rows = (rows + GpuBlockPack::kUnitRows - 1) / GpuBlockPack::kUnitRows * GpuBlockPack::kUnitRows;
  p.padded_cols = (cols + p.step_cols() - 1) / p.step_cols() * p.step_cols();
  return p;
}

}  // namespace

bool GpuBlockPack::packs(DType type) {
  GgufForm f;
  return gguf_form(type, f);
}

bool GpuBlockPack::packs(const LinearFormat& f) {
  using K = LinearFormat::Kind;
  switch (f.kind) {
    case K::GgufBlock: return packs(f.dtype);
    case K::Int4Grouped: return f.group_size == 32 || f.group_size == 64 || f.group_size == 128;
    case K::Int8PerChannel: return true;
    default: return false;
  }
}

GpuBlockPack GpuBlockPack::of(DType type, int64_t rows, int64_t cols) {
  GgufForm f{};
  SERVAL_CHECK(gguf_form(type, f), "gpu block pack: ", dtype_name(type), " is not a GGUF block type the GPU runs packed");
  SERVAL_CHECK(rows > 0 && cols > 0 && cols % f.block == 0, "gpu block pack: a [", rows, ", ", cols, "] ",
               dtype_name(type), " matrix needs whole blocks of ", f.block, " columns");
  return layout(f.bits, kGroup, f.mins, false, rows, cols);
}

GpuBlockPack GpuBlockPack::of(const LinearFormat& format, int64_t rows, int64_t cols) {
  using K = LinearFormat::Kind;
  SERVAL_CHECK(packs(format), "gpu block pack: ", format.describe(), " is not a format the GPU runs packed");
  if (format.kind == K::GgufBlock) return of(format.dtype, rows, cols);
  // Whole groups of 32 columns: the GEMV reads x 8 columns at a time and the
  // int8-x path quantizes it per 32.
  const int group = format.kind == K::Int4Grouped ? format.group_size : kGroup;
  SERVAL_CHECK(rows > 0 && cols > 0 && cols % group == 0 && cols % kGroup == 0, "gpu block pack: a [", rows, ", ",
               cols, "] ", format.describe(), " matrix needs whole groups of ", group, " columns");
  if (format.kind == K::Int8PerChannel) return layout(8, kGroup, false, true, rows, cols);
  return layout(4, group, !format.symmetric, false, rows, cols);
}

int64_t GpuBlockPack::scale_index(int64_t r, int64_t g) const {
  const int64_t u = r / kUnitRows, in_unit = r % kUnitRows;
  const int64_t lane = in_unit / 2, e = in_unit % 2;
  const int64_t s = g / groups_per_step(), j = g % groups_per_step();
  return ((kLanes * (u * steps() + s) + lane) * groups_per_step() + j) * 2 + e;
}

GpuPackWriter::GpuPackWriter(const GpuBlockPack& p) : pack_(p), out_(size_t(p.total_bytes()), 0) {
  // Padding: zero weights (nibble 8, byte 128) under zero scales and mins.
  std::memset(out_.data(), p.bits == 4 ? 0x88 : 0x80, size_t(p.quant_bytes()));
  scales_ = reinterpret_cast<uint16_t*>(out_.data() + p.scales_offset());
  row_scales_ = reinterpret_cast<float*>(out_.data() + p.scales_offset());
  if (p.mins) mins_ = reinterpret_cast<uint16_t*>(out_.data() + p.mins_offset());
}

void GpuPackWriter::quant(int64_t r, int64_t c, int q) {
  const QuantSpot at = quant_spot(pack_, r, c);
  uint8_t& b = out_[size_t(at.byte)];
  if (pack_.bits == 4)
    b = uint8_t((b & ~(15 << at.shift)) | ((q & 15) << at.shift));
  else
    b = uint8_t(q + 128);
}

std::vector<float> unpack_gpu_blocks(const GpuBlockPack& p, const uint8_t* packed) {
  const auto* scales = reinterpret_cast<const uint16_t*>(packed + p.scales_offset());
  const auto* row_scales = reinterpret_cast<const float*>(packed + p.scales_offset());
  const auto* mins = reinterpret_cast<const uint16_t*>(packed + p.mins_offset());
  std::vector<float> out(size_t(p.rows * p.cols));
  for (int64_t r = 0; r < p.rows; ++r)
    for (int64_t c = 0; c < p.cols; ++c) {
      const QuantSpot at = quant_spot(p, r, c);
      const int q = p.bits == 4 ? (packed[at.byte] >> at.shift) & 15 : int(packed[at.byte]) - 128;
      float w;
      if (p.row_scale) {
        w = float(q) * row_scales[r];
      } else {
        const int64_t i = p.scale_index(r, c / p.group);
        const float d = f16_to_f32(scales[i]);
        // As the GGUF dequantizers round: q * d + m (Q4_1), d * (q - 8) (Q4_0).
        if (p.mins)
          w = float(q) * d + f16_to_f32(mins[i]);
        else
          w = d * float(p.bits == 4 ? q - 8 : q);
      }
      out[size_t(r * p.cols + c)] = w;
    }
  return out;
}

}  // namespace serval
