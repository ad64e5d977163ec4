// CudaMatmul (cuda_matmul.h). y = x @ W^T: up to 16 rows of x through our GEMV kernel (cuda_gemv.cu),
// 17..64 through CUTLASS's decode GEMM (cuda_cutlass_gemm.cu), the others
// through cuBLASLt, bf16 in and out (or f32 logits) with f32 accumulation. With f32
// activations (--dtype float32) every shape goes through cuBLASLt in plain
// f32: f32 operands, CUBLAS_COMPUTE_32F (FFMA kernels; TF32 would need
// CUBLAS_COMPUTE_32F_FAST_TF32). How a cuBLASLt product is planned, and its
// algorithm chosen: LtMatmul. matmul_multi runs weights laid out back
// to back (q/k/v, gate/up) as one strided-batched cuBLASLt call. The gated
// MLP's products: cuda_gated_mlp.cu; the norms: cuda_norm_fold.cu.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "backend/cuda/cuda_cutlass_gemm.h"
#include "backend/cuda/cuda_launches.h"
#include "backend/cuda/cuda_matmul.h"
#include "backend/cuda/cuda_tensor.h"

namespace serval::cuda {

namespace {

// Whether ws[j] / ys[j] continue the strided batch that starts at i: the same
// shape and dtype as ws[i] / ys[i], at the stride (elements) the first step
// of the run sets, with no overlap.
bool batch_follows(const Tensor& x, const std::vector<const DeviceWeight*>& ws, const std::vector<Tensor>& ys,
                   size_t i, size_t j, int64_t& stride_w, int64_t& stride_y) {
  const CudaWeight& w0 = as_cuda(*ws[i]);
  const CudaWeight& wj = as_cuda(*ws[j]);
  const Tensor &y0 = ys[i], &yj = ys[j];
  if (wj.dtype() != w0.dtype() || wj.rows() != w0.rows() || wj.cols() != w0.cols() || yj.dtype != y0.dtype ||
      yj.rows != x.rows || yj.cols != y0.cols || y0.rows != x.rows || y0.cols != w0.rows())
    return false;
  const int64_t wb = dtype_bytes(w0.dtype(), 1), yb = dtype_bytes(y0.dtype, 1);
  const int64_t dw = static_cast<const char*>(wj.data()) - static_cast<const char*>(as_cuda(*ws[j - 1]).data());
  const int64_t dy = static_cast<const char*>(yj.data) - static_cast<const char*>(ys[j - 1].data);
  // cuBLASLt's heuristic assumes 256-byte aligned operands, batch by batch.
  if (dw % 256 != 0 || dy % 256 != 0 || dw / wb < w0.rows() * w0.cols() || dy / yb < y0.rows * y0.cols)
    return false;
  if (j == i + 1) {
    stride_w = dw / wb;
    stride_y = dy / yb;
    return true;
  }
  return dw / wb == stride_w && dy / yb == stride_y;
}

}  // namespace

// Rows the GEMV takes: 1..16; in batch-invariant mode any number.
bool CudaMatmul::own_kernel_fits(const Tensor& x) const {
  return cfg_.batch_invariant ? gemv_any_rows_fits(x) : gemv_fits(x);
}

// Products of 17..64 rows of bf16 on CUTLASS's decode GEMM
// (cuda_cutlass_gemm.cu), a programmatic dependent of the kernel before it,
// where the build has it (CudaTuning::cutlass_gemm): faster than cuBLASLt
// there, whose kernels cannot wait on the kernel before them. (Rope and the
// KV write in the q/k/v product's epilogue: up to
// CudaTuning::cutlass_rope_rows, past which the rope kernel measured faster.)
bool CudaMatmul::cutlass_rows(int64_t rows) const {
  return cfg_.tuning.cutlass_gemm && cutlass_gemm_built() && !cfg_.batch_invariant && cfg_.act_dtype == DType::BF16 &&
         rows >= 17 && rows <= kCutlassMaxRows;
}

void CudaMatmul::gemm(const GemmShape& s, const void* w, const void* x, void* y) {
  if (cutlass_rows(s.n) && cutlass_gemm(s, w, x, y, cutlass_on(dev_, cfg_))) {
    ++cutlass_gemm_calls_;
    return;
  }
  lt_.run(s, w, x, y);
}

void CudaMatmul::matmul(const Tensor& x, const CudaWeight& cw, const CudaWeight* bias, Tensor y) {
  const DType act = cfg_.act_dtype;
  SERVAL_CHECK((cw.dtype() == act || cw.packed()) && x.dtype == act, "matmul: expects ", dtype_name(act),
               " input and weight \"", cw.name(), "\"");
  SERVAL_CHECK(x.cols == cw.cols() && y.cols == cw.rows() && y.rows == x.rows, "matmul: x [", x.rows, ", ", x.cols,
               "] @ \"", cw.name(), "\" [", cw.rows(), ", ", cw.cols(), "]^T does not fit y [", y.rows, ", ",
               y.cols, "]");
  SERVAL_CHECK(y.dtype == act || (y.dtype == DType::F32 && bias == nullptr), "matmul: output must be ",
               dtype_name(act), ", or f32 without a bias");
  SERVAL_CHECK(!cw.interleaved(), "matmul: \"", cw.name(), "\" is half of an interleaved gate/up pair, which only ",
               "gated_mlp_up reads");
  if (x.rows == 0) return;
  if (cw.packed()) {
    packed_matmul(x, cw, y);
  } else if (cfg_.batch_invariant && !own_kernel_fits(x)) {
    rowwise_matmul(x, static_cast<const bf16*>(cw.data()), y, dev_.stream());
  } else if (act == DType::BF16 && own_kernel_fits(x)) {
    const bf16* w_ptr = static_cast<const bf16*>(cw.data());
    gemv(x, &w_ptr, &y, 1, launch_on(dev_, cfg_));
  } else {
    gemm({cw.rows(), x.rows, x.cols, y.dtype == DType::F32}, cw.data(), x.data, y.data);
  }
  if (bias != nullptr) {
    const CudaWeight& b = *bias;
    SERVAL_CHECK(b.dtype() == DType::F32 && b.cols() == y.cols, "matmul: bias \"", b.name(), "\" has ", b.cols(),
                 " entries, y has ", y.cols, " columns");
    add_bias(dev_.stream(), dev_.num_sms(), y, static_cast<const float*>(b.data()));
  }
}

void CudaMatmul::matmul_multi(const Tensor& x, const std::vector<const DeviceWeight*>& ws,
                              const std::vector<Tensor>& ys) {
  SERVAL_CHECK(ws.size() == ys.size(), "matmul_multi: ", ws.size(), " weights for ", ys.size(), " outputs");
  for (const DeviceWeight* w : ws)
    SERVAL_CHECK(!as_cuda(*w).interleaved(), "matmul_multi: \"", w->name(), "\" is half of an interleaved gate/up ",
                 "pair, which only gated_mlp_up reads");
  bool packed = false;
  for (const DeviceWeight* w : ws) packed = packed || as_cuda(*w).packed();
  if (packed) {  // packed weights: one launch where they go together, else each its own product
    if (packed_multi(x, ws, ys)) return;
    for (size_t i = 0; i < ws.size(); ++i) matmul(x, as_cuda(*ws[i]), nullptr, ys[i]);
    return;
  }
  bool fused = own_kernel_fits(x) && ws.size() >= 1 && ws.size() <= 3;
  const bf16* w_ptrs[3] = {};
  for (size_t i = 0; fused && i < ws.size(); ++i) {
    const CudaWeight& cw = as_cuda(*ws[i]);
    fused = cw.dtype() == DType::BF16 && cw.cols() == x.cols && ys[i].dtype == DType::BF16 &&
            ys[i].cols == cw.rows() && ys[i].rows == x.rows;
    w_ptrs[i] = static_cast<const bf16*>(cw.data());
  }
  if (fused) return gemv(x, w_ptrs, ys.data(), int(ws.size()), launch_on(dev_, cfg_));
  // (In batch-invariant mode a row the GEMV cannot read goes to matmul's
  // row-wise kernel, one weight at a time: never to cuBLASLt.)
  if (own_kernel_fits(x) || cfg_.batch_invariant) {
    for (size_t i = 0; i < ws.size(); ++i) matmul(x, as_cuda(*ws[i]), nullptr, ys[i]);
    return;
  }
  // cuBLASLt: a run of weights of one shape at one stride (upload_weight_group
  // lays q/k/v and gate/up out so) whose outputs also lie at one stride is one
  // strided-batched GEMM: more tiles per launch, one ramp and tail instead of
  // several.
  for (size_t i = 0; i < ws.size();) {
    size_t j = i + 1;
    int64_t stride_w = 0, stride_y = 0;
    while (j < ws.size() && batch_follows(x, ws, ys, i, j, stride_w, stride_y)) ++j;
    if (j - i == 1)
      matmul(x, as_cuda(*ws[i]), nullptr, ys[i]);
    else
      gemm({.m = ws[i]->rows(), .n = x.rows, .k = x.cols, .y_f32 = ys[i].dtype == DType::F32,
            .batch = int64_t(j - i), .stride_w = stride_w, .stride_y = stride_y},
           as_cuda(*ws[i]).data(), x.data, ys[i].data);
    i = j;
  }
}

// Up to 16 rows (the GEMV; any number in batch-invariant mode) with
// interleaved rope over whole heads: one launch
// computes q/k/v, rotates q and k and writes k and v to their slots in its
// epilogue, bit for bit what the GEMV then the rope + KV write kernel store,
// without that kernel between the projection and attention (one launch fewer
// per layer at batch 1). Other shapes, NeoX rope, f32, CudaTuning::gemv_rope
// off: the two ops.
bool CudaMatmul::gemv_rope_fits(const Tensor& x, const CudaWeight& cq, const CudaWeight& ck, const CudaWeight& cv,
                                const Tensor& q, const Tensor& k, const Tensor& v, const RopeParams& rope,
                                const KvGeometry& geom) const {
  const int64_t kv_row = int64_t(geom.num_kv_heads) * geom.head_dim;
  return cfg_.tuning.gemv_rope && cfg_.act_dtype == DType::BF16 && own_kernel_fits(x) && rope.style == RopeStyle::Interleaved &&
         rope.head_dim == geom.head_dim && rope.head_dim % 8 == 0 && rope.rope_dim % 2 == 0 && rope.rope_dim > 0 &&
         rope.rope_dim <= rope.head_dim && rope.inv_freq != nullptr && cq.dtype() == DType::BF16 &&
         ck.dtype() == DType::BF16 && cv.dtype() == DType::BF16 && cq.cols() == x.cols && ck.cols() == x.cols &&
         cv.cols() == x.cols && q.dtype == DType::BF16 && q.rows == x.rows && q.cols == cq.rows() &&
         q.cols % rope.head_dim == 0 && ck.rows() == kv_row && cv.rows() == kv_row && k.rows == x.rows &&
         k.cols == kv_row && v.rows == x.rows && v.cols == kv_row;
}

bool CudaMatmul::qkv_rope_kv_write(const NormedRows& xn, const CudaWeight& cq, const CudaWeight& ck,
                                   const CudaWeight& cv, Tensor q, Tensor k, Tensor v, const int32_t* positions,
                                   const RopeParams& rope, const int64_t* slot_mapping, const KvLayer& kv,
                                   const KvGeometry& geom) {
  if (cq.packed() || ck.packed() || cv.packed())
    return packed_qkv_rope_kv_write(xn, cq, ck, cv, q, k, v, positions, rope, slot_mapping, kv, geom);
  if (!gemv_rope_fits(xn.rows, cq, ck, cv, q, k, v, rope, geom)) {
    const Tensor x = normalized(xn);
    if (!stacked_qkv_fits(x, cq, ck, cv, q, rope, geom)) return false;
    if (cutlass_qkv_rope_kv_write(x, cq, ck, q, positions, rope, slot_mapping, kv, geom)) return true;
    const bf16* qkv = stacked_qkv(x, cq, ck, cv);
    rope_kv_write_from_stacked(qkv, cq.rows() + ck.rows() + cv.rows(), cq.rows(), cq.rows() + ck.rows(), q,
                               ck.rows(), positions, rope, slot_mapping, kv, geom, launch_on(dev_, cfg_));
    return true;
  }
  const Tensor& x = xn.rows;
  const bf16* w_ptrs[3] = {static_cast<const bf16*>(cq.data()), static_cast<const bf16*>(ck.data()),
                           static_cast<const bf16*>(cv.data())};
  const Tensor ys[3] = {q, k, v};
  GemvRopeKv r;
  r.positions = positions;
  r.slots = slot_mapping;
  r.inv_freq = rope.inv_freq;
  r.kv = kv_layout<bf16>(kv, geom);
  r.rope_dim = rope.rope_dim;
  gemv(x, w_ptrs, ys, 3, launch_on(dev_, cfg_), r, consume_norm(xn));
  return true;
}

// 17..256 rows on cuBLASLt with the three weights back to back in memory
// (upload_weight_group lays a layer's q, k, v out so): one GEMM of the
// stacked [q; k; v] weight into a [T, q + 2 kv] scratch, whose rows the rope +
// KV write kernel reads (rotated q into q, k and v into the pools): a GQA
// model's q alone and its k/v batch of two stream slower than its q/k/v rows
// as one larger GEMM. More rows (prefill) keep the separate products and
// their memory; so does CudaTuning::stacked_qkv off.
bool CudaMatmul::stacked_qkv_fits(const Tensor& x, const CudaWeight& wq, const CudaWeight& wk,
                                  const CudaWeight& wv, const Tensor& q, const RopeParams& rope,
                                  const KvGeometry& geom) const {
  const int64_t kv_row = int64_t(geom.num_kv_heads) * geom.head_dim;
  // One group, back to back (weights that merely happen to be adjacent are
  // not taken: which GEMM runs must not depend on where the allocator put them).
  auto follows = [](const CudaWeight& a, const CudaWeight& b) {
    return a.group() != nullptr && a.group() == b.group() &&
           static_cast<const char*>(a.data()) + a.rows() * a.cols() * 2 == static_cast<const char*>(b.data());
  };
  return cfg_.tuning.stacked_qkv && !cfg_.batch_invariant && cfg_.act_dtype == DType::BF16 && x.dtype == DType::BF16 && x.rows > 0 &&
         x.rows <= 256 &&
         !own_kernel_fits(x) && wq.dtype() == DType::BF16 && wk.dtype() == DType::BF16 &&
         wv.dtype() == DType::BF16 && wq.cols() == x.cols && wk.cols() == x.cols && wv.cols() == x.cols &&
         follows(wq, wk) && follows(wk, wv) && wk.rows() == kv_row && wv.rows() == kv_row && q.dtype == DType::BF16 &&
         q.rows == x.rows && q.cols == wq.rows() && rope.head_dim == geom.head_dim && rope.inv_freq != nullptr;
}

const bf16* CudaMatmul::stacked_qkv(const Tensor& x, const CudaWeight& wq, const CudaWeight& wk,
                                    const CudaWeight& wv) {
  const int64_t row = wq.rows() + wk.rows() + wv.rows();
  void* qkv = dev_.scratch(stacked_qkv_, x.rows * row * 2);
  gemm({.m = row, .n = x.rows, .k = x.cols}, wq.data(), x.data, qkv);
  ++stacked_qkv_calls_;
  return static_cast<const bf16*>(qkv);
}

// Where CUTLASS takes the rows with its 32-row tile (cutlass_rope_rows), rope
// of the interleaved style and the KV write happen in the product's
// epilogue: no stacked product in memory and no rope kernel.
bool CudaMatmul::cutlass_qkv_rope_kv_write(const Tensor& x, const CudaWeight& wq, const CudaWeight& wk, Tensor q,
                                           const int32_t* positions, const RopeParams& rope,
                                           const int64_t* slot_mapping, const KvLayer& kv, const KvGeometry& geom) {
  // (The epilogue's can_implement checks the widths and rope_dim.) Only
  // with the step's angles (prepare_rope_angles) for these positions.
  if (!cutlass_rope_rows(x.rows) || rope.style != RopeStyle::Interleaved ||
      q.cols != wq.rows() || rope_angles_for_ != RopeAnglesFor{positions, rope.inv_freq, x.rows, rope.rope_dim})
    return false;
  const CutlassQkvRopeKv e{static_cast<bf16*>(q.data), kv_layout<bf16>(kv, geom),
                           static_cast<const float2*>(rope_angles_.data()), slot_mapping, int(wq.rows()),
                           int(rope.rope_dim)};
  const GemmShape s{.m = wq.rows() + 2 * wk.rows(), .n = x.rows, .k = x.cols};
  if (!serval::cuda::cutlass_qkv_rope_kv_write(s, wq.data(), x.data, e, cutlass_on(dev_, cfg_))) return false;
  ++stacked_qkv_calls_;
  ++cutlass_gemm_calls_;
  ++cutlass_epilogue_calls_;
  return true;
}

// 129..256 rows of bf16 (cuBLASLt) with rows of a multiple of 256
// values: the product's k is split in two halves, computed as one strided
// batch of 2 into f32 partials, which the add + RMSNorm kernel sums (and
// rounds to bf16, as matmul's y) on its way into the residual. A 4096-output
// weight thus gets twice the output tiles (one 4096 x 4096 GEMM streams at
// ~2.5 TB/s at 64 tokens, three in one batch at 3.35), with no reduction
// kernel. Both halves and both partials start 256-byte aligned (k a multiple
// of 256, out of 64), as cuBLASLt's heuristic assumes. From 129 rows only
// (fewer lost on cuBLASLt); up to 256 only: larger prefill steps lost with
// it (the partials' f32 traffic), and its scratch, sized by the rows, stays
// small (a larger step growing it would drop every decode graph). Where
// CUTLASS's decode GEMM takes the rows (cutlass_rows) they split too: there
// the halves give a 4096-output weight 128 tiles of 64 W rows, one per SM,
// where whole it has 64. CudaTuning::split_k off: matmul then add_rmsnorm.
// Before either: the norm left to the GEMVs after it (cuda_norm_fold.cu).
std::optional<NormedRows> CudaMatmul::matmul_add_rmsnorm(const Tensor& x, const CudaWeight& cw, Tensor residual,
                                                         const CudaWeight& nw, float eps, Tensor out) {
  if (std::optional<NormedRows> deferred = defer_norm(x, cw, residual, nw, eps, out)) return deferred;
  const bool fits = cfg_.tuning.split_k && !cfg_.batch_invariant && cfg_.act_dtype == DType::BF16 &&
                    x.dtype == DType::BF16 &&
                    ((x.rows > 128 && x.rows <= 256) || (cutlass_rows(x.rows) && !own_kernel_fits(x))) &&
                    cw.dtype() == DType::BF16 && cw.cols() == x.cols &&
                    x.cols % 256 == 0 && cw.rows() % 64 == 0 &&
                    residual.dtype == DType::F32 && residual.rows == x.rows && residual.cols == cw.rows() &&
                    residual.cols % 8 == 0 && out.dtype == DType::BF16 && out.rows == x.rows &&
                    out.cols == residual.cols && nw.dtype() == DType::F32 && nw.cols() == residual.cols;
  if (!fits) return std::nullopt;
  const int64_t T = x.rows, m = cw.rows(), half = x.cols / 2;
  float* parts = static_cast<float*>(dev_.scratch(split_k_partials_, 2 * T * m * int64_t(sizeof(float))));
  gemm({.m = m, .n = T, .k = half, .y_f32 = true, .batch = 2, .stride_w = half, .stride_x = half,
        .stride_y = T * m, .ld_k = x.cols},
       cw.data(), x.data, parts);
  launch_split_add_rmsnorm(residual, parts, T * m, static_cast<const float*>(nw.data()), eps, out,
                           launch_on(dev_, cfg_));
  return NormedRows(out);
}

void CudaMatmul::prepare_rope_angles(const int32_t* positions, int64_t tokens, const RopeParams& p) {
  rope_angles_for_ = {};
  // (cutlass_rope_rows implies bf16; the epilogue's can_implement checks rope_dim.)
  if (!cutlass_rope_rows(tokens) || p.style != RopeStyle::Interleaved || p.inv_freq == nullptr || p.rope_dim <= 0)
    return;
  const int half = p.rope_dim / 2;
  // Sized for the most rows at once: growing scratch drops recorded graphs.
  auto* angles =
      static_cast<float2*>(dev_.scratch(rope_angles_, kCutlassMaxRows * half * int64_t(sizeof(float2))));
  launch_rope_angles(positions, p.inv_freq, tokens, half, angles, dev_.stream());
  rope_angles_for_ = {positions, p.inv_freq, tokens, p.rope_dim};
}

}  // namespace serval::cuda
