#pragma once
// GGUF block weights (Q8_0, Q4_0) repacked at load for the CUDA backend's
// quantized GEMV (cuda_gemv_packed.cu), which streams them at their size. Plain
// C++, built everywhere, so the layout is tested without a GPU.
//
// GGUF keeps each 32-element block as an f16 scale then the quants (18 or 34
// bytes: no 16-byte alignment). Here quants and scales are split, and ordered
// as the GEMV's lanes read them with one 16-byte load each:
//  - A row is cut into k-steps of 128 (Q4_0) or 64 (Q8_0) columns, padded with
//    zero weights to a whole step; rows are padded to a multiple of 8 (a unit).
//  - Chunk c = 4 * step + lane (lane 0..3 of an mma quad) of row r: 16 bytes at
//    q[r * row_bytes + 16 * c]. It holds, of each group (32 columns, one GGUF
//    block) of its step, columns 8 * lane .. 8 * lane + 7:
//      Q4_0: 4 words, word j = group 4 * step + j; its column 2m sits in bits
//            4m..4m+3 and column 2m + 1 in bits 16 + 4m.., so (word >> 4m) &
//            0x000F000F is the pair (2m, 2m + 1) as two 16-bit lanes. The
//            nibble is GGUF's (value = scale * (nibble - 8)).
//      Q8_0: 4 words, words 2j and 2j + 1 = group 2 * step + j, columns 0..3
//            and 4..7 of the lane's 8, one byte each in column order, stored
//            as quant + 128 (0..255).
//  - Scales (f16 bits) in the order the same lane reads them: for unit u (rows
//    8u..8u+7), step s and lane l, the groups of the step in order, each as
//    the pair (row 8u + 2l, row 8u + 2l + 1): 16 bytes (Q4_0) or 8 (Q8_0) at
//    scales + 2 * groups_per_step * (4 * (u * steps + s) + l). These are the
//    rows whose outputs lane l's mma accumulators hold.
#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace serval {

struct GpuBlockPack {
  static constexpr int kGroup = 32;    // columns per scale (one GGUF block)
  static constexpr int kUnitRows = 8;  // rows padded to a multiple of this
  static constexpr int kLanes = 4;     // chunks per k-step

  int bits = 4;              // 4 (Q4_0) or 8 (Q8_0)
  int64_t rows = 0, cols = 0;
  int64_t padded_rows = 0, padded_cols = 0;

  // The layout of a [rows, cols] matrix of `type` (Q4_0 or Q8_0; cols a
  // multiple of 32). Throws serval::Error for other types or widths.
  static GpuBlockPack of(DType type, int64_t rows, int64_t cols);
  static bool packs(DType type) { return type == DType::Q4_0 || type == DType::Q8_0; }

  int step_cols() const { return bits == 4 ? 128 : 64; }
  int groups_per_step() const { return step_cols() / kGroup; }
  int64_t steps() const { return padded_cols / step_cols(); }
  int64_t row_bytes() const { return padded_cols * bits / 8; }
  int64_t quant_bytes() const { return padded_rows * row_bytes(); }
  int64_t scale_count() const { return padded_rows * (padded_cols / kGroup); }
  // Quants, then scales at a 256-byte boundary: one allocation.
  int64_t scales_offset() const { return (quant_bytes() + 255) / 256 * 256; }
  int64_t total_bytes() const { return scales_offset() + scale_count() * 2; }
  // Index (in f16 entries) of the scale of row r, group g.
  int64_t scale_index(int64_t r, int64_t g) const;
};

// `blocks` (GGUF's [rows, cols / 32] blocks of `type`) in the layout of
// `pack`: quant_bytes() bytes of quants, then padding to scales_offset(),
// then the scales; total_bytes() in all.
std::vector<uint8_t> pack_gguf_blocks(const GpuBlockPack& pack, DType type, const void* blocks);

// The packed matrix back in f32, [rows, cols] row-major (the test's inverse:
// equals to_f32 of the GGUF blocks).
std::vector<float> unpack_gpu_blocks(const GpuBlockPack& pack, const uint8_t* packed);

}  // namespace serval
