// The MLP's first half, out = silu(x @ gate^T) * (x @ up^T) (gated_mlp_up),
// on the CUDA backend: for gate and up as two matrices, and for the pair
// that upload_gated_pair interleaves (cuda_gate_up_layout.cuh), whose
// products CUTLASS can finish in its epilogue (cuda_cutlass_gated.cu).
#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_cutlass_gemm.h"
#include "backend/cuda/cuda_decode_matmul.h"
#include "backend/cuda/cuda_gate_up_layout.cuh"

namespace serval::cuda {

// Decode batches of up to 16 rows: one GEMV launch reads gate
// row j and up row j together and writes silu(g) * u, so neither projection
// goes through memory. Larger batches, and f32 activations: two GEMMs into the
// scratch tensors, then silu_mul.
void CudaBackend::gated_mlp_up(const Tensor& x, const DeviceWeight& gate, const DeviceWeight& up, Tensor gate_buf,
                               Tensor up_buf, Tensor out) {
  const CudaWeight& g = as_cuda(gate);
  const CudaWeight& u = as_cuda(up);
  if (g.interleaved() || u.interleaved()) return interleaved_gated_mlp_up(x, g, u, up_buf, out);
  const bool fused = own_kernel_fits(x) && g.dtype() == DType::BF16 && u.dtype() == DType::BF16 &&
                     g.cols() == x.cols && u.cols() == x.cols && g.rows() == u.rows() && out.dtype == DType::BF16 &&
                     out.rows == x.rows && out.cols == g.rows();
  if (!fused) {
    settle(x);
    return Backend::gated_mlp_up(x, gate, up, gate_buf, up_buf, out);
  }
  const bf16 *gp = static_cast<const bf16*>(g.data()), *up_w = static_cast<const bf16*>(u.data());
  const GemvNorm n = consume_norm(x);
  if (n.mode == GemvNorm::kConsume) return gemv_gated(x, gp, up_w, out, launch_on(), n);
  own_matmul_gated(x, gp, up_w, out);
}

// gate/up as one interleaved pair (upload_gated_pair, cuda_gate_up_layout.cuh):
// - up to 16 rows (any rows in batch-invariant mode, where it reads them): the
//   GEMV reads the pair's rows in place, as it reads two matrices;
// - CUTLASS's rows (cutlass_rows): silu(gate) * up in the product's epilogue
//   (cuda_cutlass_gated.cu);
// - other rows: the pair's product [T, 2I] (cuBLASLt, or the row-wise kernel
//   in batch-invariant mode) into scratch up to 256 rows, else in pieces of
//   T / 2 rows into up_buf (out must not be up_buf), then silu_mul_interleaved.
void CudaBackend::interleaved_gated_mlp_up(const Tensor& x, const CudaWeight& g, const CudaWeight& u, Tensor up_buf,
                                           Tensor out) {
  const int64_t I = g.rows(), T = x.rows;
  SERVAL_CHECK(g.interleaved() && u.interleaved() && g.group() == u.group() &&
                   static_cast<const char*>(u.data()) == static_cast<const char*>(g.data()) +
                                                             kGateUpGroupRows * g.cols() * 2,
               "gated_mlp_up: \"", g.name(), "\" and \"", u.name(), "\" are not one interleaved pair");
  SERVAL_CHECK(x.dtype == DType::BF16 && out.dtype == DType::BF16 && x.cols == g.cols() && out.rows == T &&
                   out.cols == I && u.rows() == I,
               "gated_mlp_up: x [", T, ", ", x.cols, "] and the pair \"", g.name(), "\" [", I, ", ", g.cols(),
               "] do not fit out [", out.rows, ", ", out.cols, "]");
  if (T == 0) return;
  const bf16 *gp = static_cast<const bf16*>(g.data()), *up_w = static_cast<const bf16*>(u.data());
  if (batch_invariant_ ? gemv_any_rows_fits(x) : gemv_fits(x)) {
    return gemv_gated(x, gp, up_w, out, launch_on(), consume_norm(x), /*interleaved=*/true);
  }
  settle(x);
  overwritten(out);
  if (cutlass_rows(T) &&
      cutlass_silu_mul({.m = 2 * I, .n = T, .k = x.cols}, gp, x.data, bf(out), cutlass_on())) {
    ++cutlass_gemm_calls_;
    ++cutlass_epilogue_calls_;
    return;
  }
  auto product = [&](const Tensor& xs, void* y) {
    if (batch_invariant_)
      rowwise_matmul(xs, gp, Tensor{y, DType::BF16, xs.rows, 2 * I}, stream_);
    else
      gemm({.m = 2 * I, .n = xs.rows, .k = xs.cols}, gp, xs.data, y);
  };
  if (T <= 256) {
    void* y = scratch(gated_product_, T * 2 * I * 2);
    product(x, y);
    return silu_mul_interleaved(y, out);
  }
  const char *ub = static_cast<const char*>(up_buf.data), *ob = static_cast<const char*>(out.data);
  const bool apart = ub + T * I * 2 <= ob || ob + T * I * 2 <= ub;
  SERVAL_CHECK(up_buf.dtype == DType::BF16 && up_buf.numel() >= T * I && apart,
               "gated_mlp_up: up_buf must hold [", T, ", ", I, "] bf16 apart from out");
  const int64_t piece = T / 2;  // piece x 2I fits in up_buf's T x I
  for (int64_t t0 = 0; t0 < T; t0 += piece) {
    const int64_t n = std::min(piece, T - t0);
    product(x.rows_view(t0, n), up_buf.data);
    silu_mul_interleaved(up_buf.data, out.rows_view(t0, n));
  }
}

}  // namespace serval::cuda
