// The MLP's first half, out = silu(x @ gate^T) * (x @ up^T) (gated_mlp_up),
// on the CUDA backend: for gate and up as two matrices, and for the pair
// that upload_gated_pair interleaves (cuda_gate_up_layout.cuh), whose
// products CUTLASS can finish in its epilogue (cuda_cutlass_gated.cu).
#include <algorithm>

#include "backend/cuda/cuda_cutlass_gemm.h"
#include "backend/cuda/cuda_decode_matmul.h"
#include "backend/cuda/cuda_gate_up_layout.cuh"
#include "backend/cuda/cuda_launches.h"
#include "backend/cuda/cuda_matmul.h"

namespace serval::cuda {

// Decode batches of up to 16 rows: one GEMV launch reads gate
// row j and up row j together and writes silu(g) * u, so neither projection
// goes through memory. Larger batches, and f32 activations: false (the
// backend's two GEMMs into the scratch tensors, then silu_mul).
bool CudaMatmul::gated_mlp_up(const NormedRows& xn, const CudaWeight& g, const CudaWeight& u, Tensor up_buf,
                              Tensor out) {
  if (g.interleaved() || u.interleaved()) {
    interleaved_gated_mlp_up(xn, g, u, up_buf, out);
    return true;
  }
  if (g.packed() || u.packed()) return packed_gated_mlp_up(xn, g, u, out);
  const Tensor& x = xn.rows;
  const bool fused = own_kernel_fits(x) && g.dtype() == DType::BF16 && u.dtype() == DType::BF16 &&
                     g.cols() == x.cols && u.cols() == x.cols && g.rows() == u.rows() && out.dtype == DType::BF16 &&
                     out.rows == x.rows && out.cols == g.rows();
  if (!fused) return false;
  gemv_gated(x, static_cast<const bf16*>(g.data()), static_cast<const bf16*>(u.data()), out, launch_on(dev_, cfg_),
             consume_norm(xn));
  return true;
}

// gate/up as one interleaved pair (upload_gated_pair, cuda_gate_up_layout.cuh):
// - up to 16 rows (any rows in batch-invariant mode, where it reads them): the
//   GEMV reads the pair's rows in place, as it reads two matrices;
// - CUTLASS's rows (cutlass_rows): silu(gate) * up in the product's epilogue
//   (cuda_cutlass_gated.cu);
// - other rows: the pair's product [T, 2I] (cuBLASLt, or the row-wise kernel
//   in batch-invariant mode) into scratch up to 256 rows, else in pieces of
//   T / 2 rows into up_buf (out must not be up_buf), then silu_mul_interleaved.
void CudaMatmul::interleaved_gated_mlp_up(const NormedRows& xn, const CudaWeight& g, const CudaWeight& u,
                                          Tensor up_buf, Tensor out) {
  const int64_t I = g.rows(), T = xn.rows.rows;
  const Tensor& xr = xn.rows;
  SERVAL_CHECK(g.interleaved() && u.interleaved() && g.group() == u.group() &&
                   static_cast<const char*>(u.data()) == static_cast<const char*>(g.data()) +
                                                             kGateUpGroupRows * g.cols() * 2,
               "gated_mlp_up: \"", g.name(), "\" and \"", u.name(), "\" are not one interleaved pair");
  SERVAL_CHECK(xr.dtype == DType::BF16 && out.dtype == DType::BF16 && xr.cols == g.cols() && out.rows == T &&
                   out.cols == I && u.rows() == I,
               "gated_mlp_up: x [", T, ", ", xr.cols, "] and the pair \"", g.name(), "\" [", I, ", ", g.cols(),
               "] do not fit out [", out.rows, ", ", out.cols, "]");
  if (T == 0) return;
  const bf16 *gp = static_cast<const bf16*>(g.data()), *up_w = static_cast<const bf16*>(u.data());
  if (own_kernel_fits(xr)) {
    return gemv_gated(xr, gp, up_w, out, launch_on(dev_, cfg_), consume_norm(xn), /*interleaved=*/true);
  }
  const Tensor x = normalized(xn);
  if (cutlass_rows(T) && cutlass_silu_mul({.m = 2 * I, .n = T, .k = x.cols}, gp, x.data,
                                          static_cast<bf16*>(out.data), cutlass_on(dev_, cfg_))) {
    ++cutlass_gemm_calls_;
    ++cutlass_epilogue_calls_;
    return;
  }
  auto product = [&](const Tensor& xs, void* y) {
    if (cfg_.batch_invariant)
      rowwise_matmul(xs, gp, Tensor{y, DType::BF16, xs.rows, 2 * I}, dev_.stream());
    else
      gemm({.m = 2 * I, .n = xs.rows, .k = xs.cols}, gp, xs.data, y);
  };
  if (T <= 256) {
    void* y = dev_.scratch(gated_product_, T * 2 * I * 2);
    product(x, y);
    return launch_silu_mul_interleaved(y, out, dev_.num_sms(), dev_.stream());
  }
  const char *ub = static_cast<const char*>(up_buf.data), *ob = static_cast<const char*>(out.data);
  const bool apart = ub + T * I * 2 <= ob || ob + T * I * 2 <= ub;
  SERVAL_CHECK(up_buf.dtype == DType::BF16 && up_buf.numel() >= T * I && apart,
               "gated_mlp_up: up_buf must hold [", T, ", ", I, "] bf16 apart from out");
  const int64_t piece = T / 2;  // piece x 2I fits in up_buf's T x I
  for (int64_t t0 = 0; t0 < T; t0 += piece) {
    const int64_t n = std::min(piece, T - t0);
    product(x.rows_view(t0, n), up_buf.data);
    launch_silu_mul_interleaved(up_buf.data, out.rows_view(t0, n), dev_.num_sms(), dev_.stream());
  }
}

}  // namespace serval::cuda
