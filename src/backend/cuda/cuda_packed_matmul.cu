// CudaMatmul's products of quantized weights kept at their size
// (CudaWeight::packed, backend/gpu_block_pack.h; cuda_gemv_packed.cu).
//
// Up to 16 rows the packed GEMV streams the packed matrices once: q/k/v in
// one launch with rope and the KV write in its epilogue, gate and up in one
// launch that writes silu(g) * u. More rows dequantize each matrix into
// scratch for one GEMM (the backend composes the fused ops): the GEMV's
// dequantizing work grows with its rows (7B Q4_0 on an H100, in passes of
// 16: 64 sequences took 19.7 ms a step, bf16 7.4 ms), where the GEMM reuses
// each weight across rows. In batch-invariant mode every row goes through
// the GEMV, 16 at a time (a row's bits do not depend on the rows beside it).
#include <algorithm>

#include "backend/cuda/cuda_gemv_packed.h"
#include "backend/cuda/cuda_matmul.h"
#include "backend/cuda/cuda_tensor.h"

namespace serval::cuda {

namespace {

constexpr int64_t kPassRows = 16, kGemvMaxRows = 16;

PackedWeight packed_of(const CudaWeight& w) { return {static_cast<const uint8_t*>(w.data()), *w.packed()}; }

// fn(t0, n) for each pass of up to 16 rows.
template <typename Fn>
void for_each_pass(int64_t rows, Fn&& fn) {
  for (int64_t t0 = 0; t0 < rows; t0 += kPassRows) fn(t0, std::min(kPassRows, rows - t0));
}

}  // namespace

bool CudaMatmul::int8_x() const { return cfg_.tuning.packed_int8_x && !cfg_.batch_invariant; }

bool CudaMatmul::packed_gemv_rows(const Tensor& x) const {
  return x.dtype == DType::BF16 && x.rows > 0 && (x.rows <= kGemvMaxRows || cfg_.batch_invariant) &&
         x.cols % 8 == 0 && reinterpret_cast<uintptr_t>(x.data) % 16 == 0;
}

// Weights the packed GEMV reads together: packed, one form, x's width.
bool CudaMatmul::packed_together(const Tensor& x, std::span<const CudaWeight* const> ws) const {
  if (!packed_gemv_rows(x)) return false;
  for (const CudaWeight* w : ws)
    if (w->packed() == nullptr || ws[0]->packed() == nullptr || !w->packed()->same_form(*ws[0]->packed()) ||
        w->cols() != x.cols)
      return false;
  return true;
}

void CudaMatmul::packed_matmul(const Tensor& x, const CudaWeight& cw, Tensor y) {
  const PackedWeight w = packed_of(cw);
  const Launch on = launch_on(dev_, cfg_);
  const CudaWeight* one[] = {&cw};
  if (packed_together(x, one)) {
    return for_each_pass(x.rows, [&](int64_t t0, int64_t n) {
      const Tensor ys = y.rows_view(t0, n);
      ++packed_gemv_calls_;
      gemv_packed(x.rows_view(t0, n), &w, &ys, 1, on, {}, int8_x());
    });
  }
  SERVAL_CHECK(!cfg_.batch_invariant, "matmul: x [", x.rows, ", ", x.cols, "] does not fit the packed GEMV of \"",
               cw.name(), "\" (bf16, 16-byte aligned rows of a multiple of 8)");
  auto* dense = static_cast<bf16*>(dev_.scratch(dequantized_, cw.rows() * cw.cols() * 2));
  dequantize_packed(w, dense, on);
  ++dequantized_gemm_calls_;
  gemm({cw.rows(), x.rows, x.cols, y.dtype == DType::F32}, dense, x.data, y.data);
}

bool CudaMatmul::packed_multi(const Tensor& x, const std::vector<const DeviceWeight*>& ws,
                              const std::vector<Tensor>& ys) {
  if (ws.empty() || ws.size() > 3) return false;
  const CudaWeight* cw[3] = {&as_cuda(*ws[0]), nullptr, nullptr};
  for (size_t i = 1; i < ws.size(); ++i) cw[i] = &as_cuda(*ws[i]);
  if (!packed_together(x, std::span(cw, ws.size()))) return false;
  PackedWeight pw[3];
  for (size_t i = 0; i < ws.size(); ++i) {
    if (ys[i].dtype != DType::BF16 || ys[i].rows != x.rows || ys[i].cols != cw[i]->rows()) return false;
    pw[i] = packed_of(*cw[i]);
  }
  for_each_pass(x.rows, [&](int64_t t0, int64_t n) {
    Tensor part[3];
    for (size_t i = 0; i < ws.size(); ++i) part[i] = ys[i].rows_view(t0, n);
    ++packed_gemv_calls_;
    gemv_packed(x.rows_view(t0, n), pw, part, int(ws.size()), launch_on(dev_, cfg_), {}, int8_x());
  });
  return true;
}

bool CudaMatmul::packed_qkv_rope_kv_write(const NormedRows& xn, const CudaWeight& cq, const CudaWeight& ck,
                                          const CudaWeight& cv, Tensor q, Tensor k, Tensor v,
                                          const int32_t* positions, const RopeParams& rope,
                                          const int64_t* slot_mapping, const KvLayer& kv, const KvGeometry& geom) {
  const Tensor& x = xn.rows;
  const int64_t kv_row = int64_t(geom.num_kv_heads) * geom.head_dim;
  const CudaWeight* qkv[] = {&cq, &ck, &cv};
  const bool fits = !xn.deferred && packed_together(x, qkv) && cfg_.tuning.gemv_rope &&
                    rope.style == RopeStyle::Interleaved && rope.head_dim == geom.head_dim &&
                    rope.head_dim % 8 == 0 && rope.rope_dim % 2 == 0 && rope.rope_dim > 0 &&
                    rope.rope_dim <= rope.head_dim && rope.inv_freq != nullptr && q.dtype == DType::BF16 &&
                    q.rows == x.rows && q.cols == cq.rows() && q.cols % rope.head_dim == 0 && ck.rows() == kv_row &&
                    cv.rows() == kv_row && k.rows == x.rows && k.cols == kv_row && v.rows == x.rows &&
                    v.cols == kv_row;
  if (!fits) return false;
  const PackedWeight pw[3] = {packed_of(cq), packed_of(ck), packed_of(cv)};
  for_each_pass(x.rows, [&](int64_t t0, int64_t n) {
    const Tensor ys[3] = {q.rows_view(t0, n), k.rows_view(t0, n), v.rows_view(t0, n)};
    GemvRopeKv r;
    r.positions = positions + t0;
    r.slots = slot_mapping + t0;
    r.inv_freq = rope.inv_freq;
    r.kv = kv_layout<bf16>(kv, geom);
    r.rope_dim = rope.rope_dim;
    ++packed_gemv_calls_;
    gemv_packed(x.rows_view(t0, n), pw, ys, 3, launch_on(dev_, cfg_), r, int8_x());
  });
  return true;
}

bool CudaMatmul::packed_gated_mlp_up(const NormedRows& xn, const CudaWeight& g, const CudaWeight& u, Tensor out) {
  const Tensor& x = xn.rows;
  const CudaWeight* pair[] = {&g, &u};
  if (xn.deferred || !packed_together(x, pair) || g.rows() != u.rows() || out.dtype != DType::BF16 ||
      out.rows != x.rows || out.cols != g.rows())
    return false;
  const PackedWeight gate = packed_of(g), up = packed_of(u);
  for_each_pass(x.rows, [&](int64_t t0, int64_t n) {
    ++packed_gemv_calls_;
    gemv_packed_gated(x.rows_view(t0, n), gate, up, out.rows_view(t0, n), launch_on(dev_, cfg_), int8_x());
  });
  return true;
}

}  // namespace serval::cuda
