#pragma once
// The shape of one GEMM of the CUDA backend (cuBLASLt's or CUTLASS's).
#include <cstdint>
#include <tuple>

namespace serval::cuda {

// y [n, m] = x [n, k] @ W [m, k]^T, W's and x's rows ld_k long (0: k; more
// when k is a split of them); with batch > 1, `batch` of them, W, x and y
// stride_w / stride_x / stride_y elements apart.
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  bool y_f32 = false;
  int64_t batch = 1, stride_w = 0, stride_x = 0, stride_y = 0, ld_k = 0;
  int64_t ld() const { return ld_k > 0 ? ld_k : k; }
  using Key = std::tuple<int64_t, int64_t, int64_t, bool, int64_t, int64_t, int64_t, int64_t, int64_t>;
  Key key() const { return {m, n, k, y_f32, batch, stride_w, stride_x, stride_y, ld()}; }
};

}  // namespace serval::cuda
