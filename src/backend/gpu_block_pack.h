#pragma once
// Quantized weights repacked at load for the CUDA backend's quantized GEMV
// (cuda_gemv_packed.cu), which streams them at their size: GGUF Q8_0, Q4_0,
// Q4_1, Q4_K, Q5_K and Serval's Int4Grouped (group 32/64/128, symmetric or
// not) and Int8PerChannel (model/linear.h). Plain C++, built everywhere, so
// the layout is tested without a GPU.
//
// Values: 4-bit quants are nibbles n (0..15), 8-bit ones signed bytes v
// (stored as v + 128). A weight is
//   4-bit:            d * (n - 8)          (Q4_0, symmetric Int4)
//   4-bit with mins:  d * n + m            (Q4_1, Q4_K, asymmetric Int4)
//   8-bit:            d * v                (Q8_0)
//   8-bit with mins:  d * v + m            (Q5_K: v = its 5-bit quant)
//   8-bit row scale:  s[row] * v           (Int8PerChannel: f32 s, no d)
// with f16 d and m per `group` columns of a row (m: the weight at quant 0).
// GGUF's d (Q4_0, Q8_0, Q4_1) and m (Q4_1) are f16 already: those packs are
// exact. The others round to f16 once, at load: Int4's f32 scale s gives
// d = f16(s), m = f16(-s * zero); Q4_K/Q5_K's sub-block d * sc and
// -dmin * m_sub (exact in f32) give f16(d * sc) and f16(-dmin * m_sub). Each
// is then within half an f16 ulp (2^-11 relative, 2^-25 absolute below
// f16's normal range) of the exact value (tests/backend/gpu_block_pack_test.cpp
// checks each weight against that bound).
//
// GGUF keeps each 32-element block as an f16 scale then the quants (18 or 34
// bytes: no 16-byte alignment). Here quants and scales are split, and ordered
// as the GEMV's lanes read them with one 16-byte load each:
//  - A row is cut into k-steps of 128 (4-bit) or 64 (8-bit) columns, padded
//    with zero weights to a whole step; rows are padded to a multiple of 8 (a unit).
//  - Chunk c = 4 * step + lane (lane 0..3 of an mma quad) of row r: 16 bytes at
//    q[r * row_bytes + 16 * c]. It holds, of each 32 columns of its step,
//    columns 8 * lane .. 8 * lane + 7:
//      4-bit: 4 words, word j = columns 32j.. of the step; its column 2m sits
//            in bits 4m..4m+3 and column 2m + 1 in bits 16 + 4m.., so (word >>
//            4m) & 0x000F000F is the pair (2m, 2m + 1) as two 16-bit lanes.
//      8-bit: 4 words, words 2j and 2j + 1 = columns 32j.. of the step, columns
//            0..3 and 4..7 of the lane's 8, one byte each in column order,
//            stored as v + 128 (0..255).
//  - Scales (f16 bits) in the order the same lane reads them: for unit u (rows
//    8u..8u+7), step s and lane l, the scale groups of the step in order
//    (step_cols / group of them), each as the pair (row 8u + 2l, row 8u + 2l
//    + 1): 4 * groups_per_step bytes at scales + 2 * groups_per_step * (4 *
//    (u * steps + s) + l). These are the rows whose outputs lane l's mma
//    accumulators hold. Q4_0 and Q8_0 (group 32): 16 and 8 bytes, as before
//    this layout took other formats.
//  - Mins, where the format has them, in the same order as the scales, at a
//    256-byte boundary after them. Row scales (f32, one per padded row) take
//    the scales' place.
#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace serval {

struct Linear;
struct LinearFormat;

struct GpuBlockPack {
  static constexpr int kGroup = 32;    // columns of a lane's word(s) in a k-step (one GGUF block)
  static constexpr int kUnitRows = 8;  // rows padded to a multiple of this
  static constexpr int kLanes = 4;     // chunks per k-step

  int bits = 4;               // 4 or 8
  int group = kGroup;         // columns per scale (and min): 32, 64 or 128 (4-bit); 32 (8-bit)
  bool mins = false;          // an f16 min per scale (see the top)
  bool row_scale = false;     // 8-bit: one f32 scale per row instead of group scales
  int64_t rows = 0, cols = 0;
  int64_t padded_rows = 0, padded_cols = 0;

  // The layout of a [rows, cols] matrix of GGUF `type` (Q4_0, Q8_0, Q4_1,
  // Q4_K, Q5_K; cols whole blocks). Throws serval::Error for other types or widths.
  static GpuBlockPack of(DType type, int64_t rows, int64_t cols);
  // The layout of a Linear of `format` (packs(format)) and shape.
  static GpuBlockPack of(const LinearFormat& format, int64_t rows, int64_t cols);
  static bool packs(DType type);
  static bool packs(const LinearFormat& format);

  int step_cols() const { return bits == 4 ? 128 : 64; }
  int groups_per_step() const { return step_cols() / group; }  // scale groups
  int64_t steps() const { return padded_cols / step_cols(); }
  int64_t row_bytes() const { return padded_cols * bits / 8; }
  int64_t quant_bytes() const { return padded_rows * row_bytes(); }
  int64_t scale_count() const { return row_scale ? padded_rows : padded_rows * (padded_cols / group); }
  int64_t scale_bytes() const { return scale_count() * (row_scale ? 4 : 2); }
  // Quants, then scales, then mins, each at a 256-byte boundary: one allocation.
  int64_t scales_offset() const { return (quant_bytes() + 255) / 256 * 256; }
  int64_t mins_offset() const { return (scales_offset() + scale_bytes() + 255) / 256 * 256; }
  int64_t total_bytes() const { return mins ? mins_offset() + scale_count() * 2 : scales_offset() + scale_bytes(); }
  // Index (in f16 entries) of the scale and min of row r, scale group g.
  int64_t scale_index(int64_t r, int64_t g) const;
  // Whether two packs are read by the same kernel (one launch may take both).
  bool same_form(const GpuBlockPack& o) const {
    return bits == o.bits && group == o.group && mins == o.mins && row_scale == o.row_scale;
  }
};

// `blocks` (GGUF's [rows, cols / block] blocks of `type`) in the layout of
// `pack`: quant_bytes() bytes of quants, then padding to scales_offset(),
// then the scales (and mins); total_bytes() in all.
std::vector<uint8_t> pack_gguf_blocks(const GpuBlockPack& pack, DType type, const void* blocks);
// `w` (GgufBlock of a packed type, Int4Grouped or Int8PerChannel, whole) in
// the layout of GpuBlockPack::of(w.format, w.out, w.in).
std::vector<uint8_t> pack_linear(const GpuBlockPack& pack, const Linear& w);

// The packed matrix back in f32, [rows, cols] row-major (the test's inverse:
// equals to_f32 / dequantize_linear where the pack is exact, see the top).
std::vector<float> unpack_gpu_blocks(const GpuBlockPack& pack, const uint8_t* packed);

}  // namespace serval
