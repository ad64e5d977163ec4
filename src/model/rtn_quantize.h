#pragma once
// Round-to-nearest quantization of float weights into Linear's own formats
// (model/linear.h), row by row (every format's scales live within a row):
//  Int8PerChannel: scale = max|w| / 127, q = round(w / scale) in -127..127.
//  Fp8 (per row):  scale = max|w| / 448, q = e4m3(w / scale), round to nearest
//                  even, saturating (core/fp8.h).
//  Int4Grouped:    per group of group_size inputs; asymmetric, of two grids
//                  the one of less squared error: (a) scale = (max w - min w) / 15,
//                  zero = -min w / scale (an f32, not rounded); (b) lo = min(0, min w),
//                  hi = max(0, max w), scale = (hi - lo) / 15, zero = round(-lo / scale),
//                  scale grown to max(scale, -lo / zero, hi / (15 - zero)) so
//                  neither end clamps; both represent min..max of every group.
//                  q = clamp(round(w / scale + zero), 0, 15) (a group of one
//                  value v != 0: scale |v| / 8, zero 0 or 16, q 8);
//                  symmetric (AutoAWQ's): scale = max|w| / 7, zero 8,
//                  q = clamp(round(w / scale), -8, 7) + 8.
// All arithmetic in f32, round() ties to even. A row or group of zeros gets
// scale 1 (and zero 8). Re-quantizing a dequantized int8, fp8 or symmetric
// int4 matrix gives back the same codes; asymmetric int4 need not (f32
// rounding of the recomputed scale and zero may move a code).
#include <cstdint>
#include <string>
#include <vector>

#include "model/linear.h"

namespace serval {

// Bytes of one row's codes (in, or in / 2 for int4) and its number of scales
// (1, or in / group_size).
int64_t rtn_row_bytes(const LinearFormat& f, int64_t in);
int64_t rtn_row_scales(const LinearFormat& f, int64_t in);

// Quantizes the `in` weights of one row into `codes` (rtn_row_bytes), `scales`
// and, for asymmetric int4, `zeros` (rtn_row_scales each; zeros may be null
// otherwise). Throws naming `name` for a non-finite weight or a group size
// that does not divide `in`.
void quantize_row_rtn(const LinearFormat& f, const std::string& name, const float* w, int64_t in, uint8_t* codes,
                      float* scales, float* zeros);

// A whole [out, in] matrix, with a Linear viewing it (valid while this lives).
struct RtnMatrix {
  std::vector<uint8_t> codes;
  std::vector<float> scales, zeros;
  Linear linear;
};
RtnMatrix quantize_matrix_rtn(const LinearFormat& f, const std::string& name, const float* w, int64_t out, int64_t in);

// The format `want` (Int8PerChannel, Int4Grouped, Fp8) takes for a matrix of
// `in` columns: itself, or int8 per channel where the group size does not
// divide `in`; `why` then says so.
LinearFormat rtn_format_for(const LinearFormat& want, int64_t in, std::string& why);

}  // namespace serval
