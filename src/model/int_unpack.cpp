// Unpacking of the tools' int32 words (see int_unpack.h).
#include "model/int_unpack.h"

#include <cstring>

namespace serval {

namespace {

uint32_t word_at(const uint8_t* words, int64_t i) {
  uint32_t w;
  std::memcpy(&w, words + i * 4, 4);  // safetensors data need not be 4-aligned
  return w;
}

}  // namespace

std::vector<uint8_t> unpack_int32_rows(const uint8_t* words, int64_t rows, int64_t words_per_row, int bits,
                                       int64_t cols, const int* order) {
  const int per = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  std::vector<uint8_t> out(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int field = order ? order[c % per] : int(c % per);
      out[size_t(r * cols + c)] = uint8_t((word_at(words, r * words_per_row + c / per) >> (field * bits)) & mask);
    }
  return out;
}

std::vector<uint8_t> unpack_int32_cols(const uint8_t* words, int64_t rows, int64_t cols, int bits) {
  const int per = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  std::vector<uint8_t> out(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[size_t(r * cols + c)] = uint8_t((word_at(words, (r / per) * cols + c) >> ((r % per) * bits)) & mask);
  return out;
}

std::vector<uint8_t> transpose_bytes(const std::vector<uint8_t>& v, int64_t rows, int64_t cols) {
  std::vector<uint8_t> t(v.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = v[size_t(r * cols + c)];
  return t;
}

std::vector<float> transpose_floats(const std::vector<float>& v, int64_t rows, int64_t cols) {
  std::vector<float> t(v.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = v[size_t(r * cols + c)];
  return t;
}

bool UnpackedInt::contiguous_groups() const {
  if (groups <= 0 || in % groups != 0) return false;
  const int64_t g = in / groups;
  for (size_t c = 0; c < g_idx.size(); ++c)
    if (g_idx[c] != int64_t(c) / g) return false;
  return true;
}

bool UnpackedInt::zeros_are_midpoint() const {
  const float mid = float(1 << (bits - 1));
  for (float z : zero)
    if (z != mid) return false;
  return true;
}

std::vector<uint8_t> UnpackedInt::int4_bytes() const {
  std::vector<uint8_t> b(size_t(out * (in / 2)));
  for (int64_t r = 0; r < out; ++r)
    for (int64_t c = 0; c + 1 < in; c += 2)
      b[size_t(r * (in / 2) + c / 2)] = uint8_t(q[size_t(r * in + c)] | (q[size_t(r * in + c + 1)] << 4));
  return b;
}

std::vector<float> UnpackedInt::dequantize() const {
  std::vector<float> w(size_t(out * in));
  const float mid = float(1 << (bits - 1));
  const int64_t g = groups > 0 && in % groups == 0 ? in / groups : 1;
  for (int64_t r = 0; r < out; ++r)
    for (int64_t c = 0; c < in; ++c) {
      const int64_t gi = r * groups + (g_idx.empty() ? c / g : g_idx[size_t(c)]);
      w[size_t(r * in + c)] = (float(q[size_t(r * in + c)]) - (zero.empty() ? mid : zero[size_t(gi)])) * scale[size_t(gi)];
    }
  return w;
}

}  // namespace serval
