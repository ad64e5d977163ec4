// y = x @ W^T through cuBLASLt, bf16 in and out with f32 accumulation. The
// algorithm for each (out, tokens, in) shape is chosen once by cuBLASLt's
// heuristic and cached with its descriptors.
#include "backend/cuda/cuda_backend.h"

namespace serval::cuda {

void add_bias(cudaStream_t stream, int sms, Tensor y, const float* bias);  // cuda_elementwise.cu
bool gemv_fits(const Tensor& x);                                            // cuda_gemv.cu
void gemv(const Tensor& x, const bf16* const* ws, const Tensor* ys, int n, cudaStream_t stream);

namespace {

void lt_check(cublasStatus_t st, const char* what) {
  SERVAL_CHECK(st == CUBLAS_STATUS_SUCCESS, "cuBLASLt: ", what, " failed with status ", int(st));
}

}  // namespace

// cuBLASLt is column-major: y^T [out, T] = W [in, out]^T-as-stored * x^T [in, T].
// Row-major W {out, in} is column-major [in, out] with ld = in, hence op(A) = T.
// The output is bf16, or f32 for the LM head's logits (y_f32).
const CudaBackend::MatmulPlan& CudaBackend::matmul_plan(int64_t m, int64_t n, int64_t k, bool y_f32) {
  const auto key = std::make_tuple(m, n, y_f32 ? -k : k);
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  MatmulPlan p;
  lt_check(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  lt_check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "set TRANSA");
  lt_check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "set TRANSB");
  lt_check(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, uint64_t(k), uint64_t(m), k), "layout A");
  lt_check(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, uint64_t(k), uint64_t(n), k), "layout B");
  lt_check(cublasLtMatrixLayoutCreate(&p.c, y_f32 ? CUDA_R_32F : CUDA_R_16BF, uint64_t(m), uint64_t(n), m),
           "layout C");
  cublasLtMatmulPreference_t pref = nullptr;
  lt_check(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
  const uint64_t ws = uint64_t(lt_workspace_.bytes());
  lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
           "set workspace");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  SERVAL_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0, "cuBLASLt: no algorithm for a bf16 matmul of out ", m,
               ", tokens ", n, ", in ", k, " (status ", int(st), ")");
  p.algo = result.algo;
  return plans_.emplace(key, p).first->second;
}

void CudaBackend::matmul(const Tensor& x, const DeviceWeight& w, const DeviceWeight* bias, Tensor y) {
  const CudaWeight& cw = as_cuda(w);
  SERVAL_CHECK(cw.dtype() == DType::BF16 && x.dtype == DType::BF16, "matmul: expects bf16 input and weight \"",
               cw.name(), "\"");
  SERVAL_CHECK(x.cols == cw.cols() && y.cols == cw.rows() && y.rows == x.rows, "matmul: x [", x.rows, ", ", x.cols,
               "] @ \"", cw.name(), "\" [", cw.rows(), ", ", cw.cols(), "]^T does not fit y [", y.rows, ", ",
               y.cols, "]");
  SERVAL_CHECK(y.dtype == DType::BF16 || (y.dtype == DType::F32 && bias == nullptr),
               "matmul: output must be bf16, or f32 without a bias");
  if (x.rows == 0) return;
  if (gemv_fits(x)) {
    const bf16* w_ptr = static_cast<const bf16*>(cw.data());
    gemv(x, &w_ptr, &y, 1, stream_);
  } else {
    const MatmulPlan& p = matmul_plan(cw.rows(), x.rows, x.cols, y.dtype == DType::F32);
    const float one = 1.0f, zero = 0.0f;
    lt_check(cublasLtMatmul(lt_, p.op, &one, cw.data(), p.a, x.data, p.b, &zero, y.data, p.c, y.data, p.c, &p.algo,
                            lt_workspace_.data(), size_t(lt_workspace_.bytes()), stream_),
             "Matmul");
  }
  if (bias != nullptr) {
    const CudaWeight& b = as_cuda(*bias);
    SERVAL_CHECK(b.dtype() == DType::F32 && b.cols() == y.cols, "matmul: bias \"", b.name(), "\" has ", b.cols(),
                 " entries, y has ", y.cols, " columns");
    add_bias(stream_, num_sms_, y, static_cast<const float*>(b.data()));
  }
}

void CudaBackend::matmul_multi(const Tensor& x, const std::vector<const DeviceWeight*>& ws,
                               const std::vector<Tensor>& ys) {
  SERVAL_CHECK(ws.size() == ys.size(), "matmul_multi: ", ws.size(), " weights for ", ys.size(), " outputs");
  bool fused = gemv_fits(x) && x.dtype == DType::BF16 && ws.size() <= 3;
  const bf16* w_ptrs[3] = {};
  for (size_t i = 0; fused && i < ws.size(); ++i) {
    const CudaWeight& cw = as_cuda(*ws[i]);
    fused = cw.dtype() == DType::BF16 && cw.cols() == x.cols && ys[i].dtype == DType::BF16 &&
            ys[i].cols == cw.rows() && ys[i].rows == x.rows;
    w_ptrs[i] = static_cast<const bf16*>(cw.data());
  }
  if (!fused) return Backend::matmul_multi(x, ws, ys);
  gemv(x, w_ptrs, ys.data(), int(ws.size()), stream_);
}

}  // namespace serval::cuda
