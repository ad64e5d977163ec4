#include "model/qk_permute.h"

#include <cstring>

#include "core/error.h"

namespace serval {

void permute_qk_rows(const void* src, void* dst, int64_t n_head, int64_t head_dim, int64_t row_bytes,
                     int64_t rope_dim) {
  if (rope_dim == 0) rope_dim = head_dim;
  SERVAL_CHECK(rope_dim % 2 == 0 && rope_dim > 0 && rope_dim <= head_dim, "permute_qk_rows: rope_dim ", rope_dim,
               " must be even and within head_dim ", head_dim);
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  const int64_t half = rope_dim / 2;
  auto off = [&](int64_t h, int64_t r) { return (h * head_dim + r) * row_bytes; };  // row r of head h
  for (int64_t h = 0; h < n_head; ++h) {
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j) std::memcpy(d + off(h, 2 * i + j), s + off(h, j * half + i), size_t(row_bytes));
    if (head_dim > rope_dim)
      std::memcpy(d + off(h, rope_dim), s + off(h, rope_dim), size_t((head_dim - rope_dim) * row_bytes));
  }
}

}  // namespace serval
