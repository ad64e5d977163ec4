#pragma once
// Integer weights as the quantization tools pack them (GPTQ, AutoAWQ,
// compressed-tensors: 32 / bits values to an int32, lowest bits first),
// unpacked to one value a byte, and brought to Linear's formats: Int4Grouped
// where each group is a contiguous run of inputs, else a dense f32 matrix.
#include <cstdint>
#include <vector>

namespace serval {

// AutoAWQ's GEMM order: value j of a word of eight lies in nibble kAwqNibble[j]
// (AWQ packs columns 0 2 4 6 1 3 5 7 into nibbles 0..7).
inline constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

// int32 words `words` [rows, words_per_row] (little-endian bytes, any
// alignment) unpacked along their rows: value c of row r is field
// order[c % per] of word (r, c / per), per = 32 / bits (order null: field
// c % per). Returns [rows, cols] values of 0 .. 2^bits - 1; cols <= words_per_row * per.
std::vector<uint8_t> unpack_int32_rows(const uint8_t* words, int64_t rows, int64_t words_per_row, int bits,
                                       int64_t cols, const int* order = nullptr);
// The same packed down the columns: value (r, c) is field r % per of word
// (r / per, c); `words` is [ceil(rows / per), cols].
std::vector<uint8_t> unpack_int32_cols(const uint8_t* words, int64_t rows, int64_t cols, int bits);
// [rows, cols] -> [cols, rows].
std::vector<uint8_t> transpose_bytes(const std::vector<uint8_t>& v, int64_t rows, int64_t cols);
std::vector<float> transpose_floats(const std::vector<float>& v, int64_t rows, int64_t cols);

// A weight unpacked: w[o, c] = (q[o, c] - zero[o, g]) * scale[o, g] with
// g = g_idx[c] (empty g_idx: c / (in / groups)) and zero 2^(bits - 1) when
// `zero` is empty.
struct UnpackedInt {
  int64_t out = 0, in = 0, groups = 0;
  int bits = 4;
  std::vector<uint8_t> q;          // [out, in]
  std::vector<float> scale, zero;  // [out, groups]
  std::vector<int32_t> g_idx;      // [in]

  // Whether group g holds inputs g * in / groups .. (g + 1) * in / groups - 1.
  bool contiguous_groups() const;
  // Whether every zero point is 2^(bits - 1) (the symmetric grid).
  bool zeros_are_midpoint() const;
  // Int4Grouped's tensors (model/linear.h): two values a byte, low nibble
  // first, [out, in / 2]; needs bits 4 and contiguous groups.
  std::vector<uint8_t> int4_bytes() const;
  // The exact f32 [out, in] matrix.
  std::vector<float> dequantize() const;
};

}  // namespace serval
