#pragma once
// Our own kernel for the matmuls of decode-sized batches (bf16 x, W and y,
// or an f32 y alone): the GEMV for 1..16 rows of x (cuda_gemv.cu), also in
// the fused forms (up to three weights in one launch; silu(x gate^T) *
// (x up^T)). CudaBackend's matmuls dispatch here (cuda_matmul.cu), and so
// does bench/cuda_gemv_bench.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_kv_layout.h"
#include "backend/cuda/cuda_launch.h"
#include "runtime/backend.h"

namespace serval::cuda {

// x fits the GEMV: bf16, 1..16 rows, a multiple of 8 columns, 16-byte aligned.
bool gemv_fits(const Tensor& x);
// The same with any number of rows: gemv() and gemv_gated() take more than
// 16 in groups of 16, each row getting the bits it gets alone (for
// batch-invariant mode; slower than cuBLASLt for many rows).
bool gemv_any_rows_fits(const Tensor& x);
// The q/k/v GEMV's epilogue for qkv_rope_kv_write: q (output 0) and k
// (output 1) rotated at positions[t] (interleaved pairs: dims 2i and 2i + 1 of
// a head turn by positions[t] * inv_freq[i], for dims below rope_dim), then q
// stored to its output and k, v (output 2) to the pools' rows slots[t] instead
// of theirs; the values and roundings of the GEMV followed by the rope + KV
// write kernel. positions == nullptr: a plain GEMV.
struct GemvRopeKv {
  const int32_t* positions = nullptr;
  const int64_t* slots = nullptr;
  const float* inv_freq = nullptr;
  KvPoolLayout<__nv_bfloat16> kv;  // its head_dim is the rope's
  int rope_dim = 0;
};
// An RMSNorm between two GEMVs, done by the two of them: no norm kernel runs
// between them, so the second's x is ready when the first ends (at batch 1
// each norm kernel held the GEMV after it back ~1.8 us). The norm's weight
// is in the second GEMV's weights (Backend::fold_norm_weight).
//  - kProduce (a projection back into the residual, one bf16 weight): each
//    output, rounded to bf16 as a plain GEMV stores it, is added into the f32
//    residual [tokens, rows] (read when the unit starts), and the sum goes to
//    y in bf16: the next GEMV's x.
//  - kConsume (q/k/v with rope, or gate/up): every product of token t is
//    multiplied by scale[t] = 1 / sqrt(sum of x[t, :]^2 / cols + eps) before
//    the epilogue (rope, silu). The scales come from `scales` (written by
//    gemv_row_scales), or with none there each block works them out from x
//    (in L1 by then) at its first unit end: cheaper than a kernel between
//    the two GEMVs up to 4 rows, dearer from 5. Both sum a row in the same
//    order (gemv_row_square_sum), so a row gets the same bits either way.
struct GemvNorm {
  enum Mode : int { kNone = 0, kProduce = 1, kConsume = 2 };
  Mode mode = kNone;
  float* residual = nullptr;      // kProduce
  int cols = 0;                   // kConsume: x's width
  float eps = 0;                  // kConsume
  const float* scales = nullptr;  // kConsume: [tokens], or null
};
// Up to this many rows a kConsume GEMV works out its scales itself.
constexpr int kGemvNormOwnScalesMaxTokens = 4;
// scales[t] = 1 / sqrt(sum of x[t, :]^2 / x.cols + eps) for GemvNorm::scales
// (bf16 x, up to 16 rows, a multiple of 8 columns).
void gemv_row_scales(const Tensor& x, float eps, float* scales, const Launch& on);

// ys[i] = x @ ws[i]^T for 1..3 weights; the outputs all bf16, or a single f32
// one. With rope.positions: exactly three bf16 outputs, q/k/v (see GemvRopeKv).
// `norm`: kProduce with one bf16 output, or kConsume with rope (up to 16 rows).
void gemv(const Tensor& x, const __nv_bfloat16* const* ws, const Tensor* ys, int n, const Launch& on,
          const GemvRopeKv& rope = {}, const GemvNorm& norm = {});
// out = silu(x @ gate^T) * (x @ up^T), bf16; gate and up are [out.cols, x.cols],
// or an interleaved pair (cuda_gate_up_layout.cuh: `interleaved`).
// `norm`: kNone or kConsume (up to 16 rows).
void gemv_gated(const Tensor& x, const __nv_bfloat16* gate, const __nv_bfloat16* up, Tensor out, const Launch& on,
                const GemvNorm& norm = {}, bool interleaved = false);

// y = x @ w^T for any bf16 x (y bf16 or f32): one warp per output, in a fixed
// order (cuda_rowwise_matmul.cu). Batch-invariant mode's matmul for the inputs
// the GEMV cannot read.
void rowwise_matmul(const Tensor& x, const __nv_bfloat16* w, const Tensor& y, cudaStream_t stream);

}  // namespace serval::cuda
