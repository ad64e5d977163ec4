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
// unnormalized: `pending_norm_` says so, and an op that reads it some other
// way first normalizes it in place (settle), so every op still sees what the
// Backend interface promises.
//
// Why: at batch 1 each of the 64 norm kernels of a 7B step held the GEMV after
// it back ~1.8 us. CudaTuning::norm_elision off: the norm kernels run
// (weights still folded); norm_fold off: neither.
#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_decode_matmul.h"
#include "backend/cuda/cuda_gate_up_layout.cuh"
#include "backend/cuda/cuda_stats.h"

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
  return tuning_.norm_fold && act_dtype_ == DType::BF16;
}

void CudaBackend::fold_norm_weight(const DeviceWeight& norm, const std::vector<DeviceWeight*>& ws) {
  const CudaWeight& g = as_cuda(norm);
  SERVAL_CHECK(g.dtype() == DType::F32 && g.shape().size() == 1, "fold_norm_weight: \"", g.name(),
               "\" is not a norm vector");
  for (DeviceWeight* w : ws) {
    const CudaWeight& cw = as_cuda(*w);
    SERVAL_CHECK(cw.dtype() == DType::BF16 && cw.shape().size() == 2 && cw.cols() == g.cols(), "fold_norm_weight: \"",
                 cw.name(), "\" is not a bf16 matrix of ", g.cols(), " columns");
    const int64_t n = cw.rows() * cw.cols();
    const int blocks = int(std::min<int64_t>((n + 255) / 256, int64_t(num_sms_) * 16));
    fold_norm_kernel<<<blocks, 256, 0, stream_>>>(static_cast<bf16*>(const_cast<void*>(cw.data())),
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
bool CudaBackend::elide_norm(const Tensor& x, const CudaWeight& w, const Tensor& residual, const CudaWeight& norm,
                             const Tensor& out) const {
  return tuning_.norm_elision && norm.unit() && !batch_invariant_ && act_dtype_ == DType::BF16 && gemv_fits(x) &&
         w.dtype() == DType::BF16 && w.cols() == x.cols && w.rows() % 8 == 0 && residual.dtype == DType::F32 &&
         residual.rows == x.rows && residual.cols == w.rows() && out.dtype == DType::BF16 && out.rows == x.rows &&
         out.cols == w.rows();
}

void CudaBackend::produce_norm(const Tensor& x, const CudaWeight& w, Tensor residual, float eps, Tensor out) {
  // One pending norm at a time: another (live) buffer's is applied now.
  if (pending_norm_->data != nullptr && pending_norm_->data != out.data)
    settle(pending_norm_->data, pending_norm_->bytes);
  GemvNorm n;
  n.mode = GemvNorm::kProduce;
  n.residual = static_cast<float*>(residual.data);
  const bf16* wp = static_cast<const bf16*>(w.data());
  gemv(x, &wp, &out, 1, launch_on(), {}, n);
  // Before any graph records this: settle's weight of ones, consume_norm's scales.
  if (!unit_norm_ || unit_norm_->cols() != w.rows()) {
    const std::vector<float> ones(static_cast<size_t>(w.rows()), 1.0f);
    unit_norm_ = upload_weight(TensorView{"unit_norm", DType::F32, {w.rows()}, ones.data(), w.rows() * 4});
  }
  if (norm_scales_.data() == nullptr) norm_scales_ = alloc(16 * sizeof(float));
  *pending_norm_ = PendingNorm{out.data, dtype_bytes(out.dtype, out.numel()), int(w.rows()), eps};
  ++elided_norms_;
}

int64_t elided_norms(const Backend& be) { return cuda_backend_of(be, "elided_norms").elided_norms(); }

GemvNorm CudaBackend::consume_norm(const Tensor& x) {
  const PendingNorm& p = *pending_norm_;
  if (!p.overlaps(x.data, dtype_bytes(x.dtype, x.numel()))) return {};
  if (!gemv_fits(x) || batch_invariant_ || x.data != p.data || x.dtype != DType::BF16 || x.cols != p.cols) {
    settle(x);
    return {};
  }
  GemvNorm n;
  n.mode = GemvNorm::kConsume;
  n.cols = p.cols;
  n.eps = p.eps;
  if (x.rows > kGemvNormOwnScalesMaxTokens) {  // one small kernel beats every block summing x
    auto* scales = static_cast<float*>(norm_scales_.data());
    if (!p.scales_written) gemv_row_scales(x, p.eps, scales, launch_on());
    pending_norm_->scales_written = true;
    n.scales = scales;
  }
  return n;
}

void CudaBackend::settle(const void* data, int64_t bytes) {
  if (!pending_norm_->overlaps(data, bytes)) return;
  const PendingNorm p = *pending_norm_;
  *pending_norm_ = PendingNorm{};  // first: rmsnorm settles its input too
  const Tensor x{const_cast<void*>(p.data), DType::BF16, p.bytes / (int64_t(p.cols) * 2), p.cols};
  rmsnorm(x, *unit_norm_, p.eps, x);  // the norm kernel the GEMVs stood in for, with its weight folded away
}

void CudaBackend::overwritten(const Tensor& t) {
  if (pending_norm_->overlaps(t.data, dtype_bytes(t.dtype, t.numel()))) *pending_norm_ = PendingNorm{};
}

}  // namespace serval::cuda
