// RMSNorm weights folded into the matrices after them, and the norms between
// two GEMVs done by those GEMVs.
//
// The runner folds each layer's attention and FFN norm weights into q/k/v and
// gate/up (fold_norm_weight) and runs those norms with a weight of ones. At up
// to 16 rows (the GEMV), matmul_add_rmsnorm with such a unit norm launches no
// norm kernel: the o or down projection's GEMV adds into the residual and
// writes it in bf16 as the next x (GemvNorm's kProduce); the q/k/v or gate/up
// GEMV after it scales its products by the rows' 1 / rms (kConsume), which it
// works out itself up to 4 rows and reads from a one-warp-per-row kernel
// (gemv_row_scales) from 5. Between the two, the buffer holds the residual
// unnormalized: the NormedRows that matmul_add_rmsnorm returns says so
// (deferred), and only the ops that take a NormedRows read it; any other
// reader gets it through finish_norm (in place) or normalized (a copy).
//
// Why: at batch 1 each of the 64 norm kernels of a 7B step held the GEMV after
// it back ~1.8 us. CudaTuning::norm_elision off: the norm kernels run
// (weights still folded); norm_fold off: neither.
#include <algorithm>
#include <optional>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_decode_matmul.h"
#include "backend/cuda/cuda_gate_up_layout.cuh"
#include "backend/cuda/cuda_launches.h"

namespace serval::cuda {

namespace {

// w[r, c] *= g[c], in f32, rounded back to bf16; row r at gate_up_row(r)
// if `interleaved` (a gate/up pair's, cuda_gate_up_layout.cuh).
__global__ void fold_norm_kernel(bf16* w, const float* g, int64_t rows, int64_t cols, bool interleaved) {
  const int64_t n = rows * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    bf16& e = w[(interleaved ? gate_up_row(r) : r) * cols + c];
    e = __float2bfloat16(__bfloat162float(e) * g[c]);
  }
}

}  // namespace

bool CudaBackend::folds_norm_weights() const {
  return cfg_.tuning.norm_fold && cfg_.act_dtype == DType::BF16;
}

void CudaBackend::fold_norm_weight(const DeviceWeight& norm, const std::vector<DeviceWeight*>& ws) {
  dev_.bind();
  const CudaWeight& g = as_cuda(norm);
  SERVAL_CHECK(g.dtype() == DType::F32 && g.shape().size() == 1, "fold_norm_weight: \"", g.name(),
               "\" is not a norm vector");
  for (DeviceWeight* w : ws) {
    const CudaWeight& cw = as_cuda(*w);
    SERVAL_CHECK(cw.dtype() == DType::BF16 && cw.shape().size() == 2 && cw.cols() == g.cols(), "fold_norm_weight: \"",
                 cw.name(), "\" is not a bf16 matrix of ", g.cols(), " columns");
    const int64_t n = cw.rows() * cw.cols();
    const int blocks = int(std::min<int64_t>((n + 255) / 256, int64_t(dev_.num_sms()) * 16));
    fold_norm_kernel<<<blocks, 256, 0, dev_.stream()>>>(static_cast<bf16*>(const_cast<void*>(cw.data())),
                                                   static_cast<const float*>(g.data()), cw.rows(), cw.cols(),
                                                   cw.interleaved());
    SERVAL_CUDA_LAUNCH_CHECK();
  }
}

// matmul_add_rmsnorm with the norm left to the next GEMV: a unit norm (its
// weight folded into the next matrices), up to 16 bf16 rows (the GEMV's), rows
// of whole units. Not in batch-invariant mode, whose wide kernel (over 16
// rows) has no such epilogue: a row would get other bits alone than in a
// batch of 17.
std::optional<NormedRows> CudaMatmul::defer_norm(const Tensor& x, const CudaWeight& w, Tensor residual,
                                                 const CudaWeight& norm, float eps, Tensor out) {
  const bool fits = cfg_.tuning.norm_elision && norm.unit() && !cfg_.batch_invariant &&
                    cfg_.act_dtype == DType::BF16 && gemv_fits(x) && w.dtype() == DType::BF16 &&
                    w.cols() == x.cols && w.rows() % 8 == 0 && residual.dtype == DType::F32 &&
                    residual.rows == x.rows && residual.cols == w.rows() && out.dtype == DType::BF16 &&
                    out.rows == x.rows && out.cols == w.rows();
  if (!fits) return std::nullopt;
  GemvNorm n;
  n.mode = GemvNorm::kProduce;
  n.residual = static_cast<float*>(residual.data);
  const bf16* wp = static_cast<const bf16*>(w.data());
  gemv(x, &wp, &out, 1, launch_on(dev_, cfg_), {}, n);
  // Before any graph records a consumer: the scales and the ones they may need.
  unit_norm(w.rows());
  if (norm_scales_.data() == nullptr) norm_scales_ = dev_.alloc(16 * sizeof(float));
  ++elided_norms_;
  return NormedRows(out, eps, /*deferred=*/true);
}

GemvNorm CudaMatmul::consume_norm(const NormedRows& x) {
  if (!x.deferred) return {};
  SERVAL_CHECK(gemv_fits(x.rows) && !cfg_.batch_invariant, "gemv: ", x.rows.rows,
               " rows with a deferred norm are more than the GEMV takes");
  GemvNorm n;
  n.mode = GemvNorm::kConsume;
  n.cols = int(x.rows.cols);
  n.eps = x.eps;
  if (x.rows.rows > kGemvNormOwnScalesMaxTokens) {  // one small kernel beats every block summing x
    auto* scales = static_cast<float*>(norm_scales_.data());
    gemv_row_scales(x.rows, x.eps, scales, launch_on(dev_, cfg_));
    n.scales = scales;
  }
  return n;
}

const float* CudaMatmul::unit_norm(int64_t cols) {
  if (unit_norm_.bytes() < cols * int64_t(sizeof(float))) {
    const std::vector<float> ones(static_cast<size_t>(cols), 1.0f);
    unit_norm_ = dev_.alloc(cols * int64_t(sizeof(float)));
    dev_.copy_to_device(unit_norm_.data(), ones.data(), cols * int64_t(sizeof(float)));
  }
  return static_cast<const float*>(unit_norm_.data());
}

// The norm kernel the GEMVs stood in for, with its weight folded away.
Tensor CudaMatmul::finish_norm(NormedRows& x) {
  if (x.deferred) {
    launch_rmsnorm(x.rows, unit_norm(x.rows.cols), x.eps, x.rows, launch_on(dev_, cfg_));
    x.deferred = false;
  }
  return x.rows;
}

Tensor CudaMatmul::normalized(const NormedRows& x) {
  if (!x.deferred) return x.rows;
  const Tensor& r = x.rows;
  const Tensor copy{dev_.scratch(norm_copy_, dtype_bytes(r.dtype, r.numel())), r.dtype, r.rows, r.cols};
  launch_rmsnorm(r, unit_norm(r.cols), x.eps, copy, launch_on(dev_, cfg_));
  return copy;
}

}  // namespace serval::cuda
