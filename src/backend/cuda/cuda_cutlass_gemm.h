#pragma once
// Decode GEMMs through CUTLASS's Hopper kernel, for the products of 17..64
// rows that would otherwise go to cuBLASLt: plain (cuda_cutlass_gemm.cu), or
// finished in the epilogue (cuda_cutlass_qkv_rope.cu, cuda_cutlass_gated.cu).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_gemm_shape.h"
#include "backend/cuda/cuda_kv_layout.h"

namespace serval::cuda {

// Whether this build has CUTLASS (its headers were found at configure time).
bool cutlass_gemm_built();

// How the decode GEMMs launch (CudaTuning's pdl and cutlass_* keys).
struct CutlassLaunch {
  cudaStream_t stream = nullptr;
  int sms = 0;      // the device's SM count: W tiles sized to its waves
  bool pdl = true;  // as a programmatic dependent of the kernel before
  bool swap = true;        // 33..64 rows: the swapped kernel
  bool swap_gated = true;  // the same for the gate/up pair (cutlass_silu_mul)
  bool two_ctas = true;    // 17..32 rows: two CTAs per SM
  int w_prefetch_k_blocks = 4;  // k blocks of W asked of L2 before the wait
};

// y = x @ W^T as `s` says (bf16 W and x; y bf16, or f32 when s.y_f32), at
// most kCutlassMaxRows rows, launched as `l` says. Returns false, having
// launched nothing, where CUTLASS cannot take the operands (alignment) or
// the build has no CUTLASS.
constexpr int64_t kCutlassMaxRows = 64;  // one tile of 64 rows of x
bool cutlass_gemm(const GemmShape& s, const void* w, const void* x, void* y, const CutlassLaunch& l);

// Where the stacked q/k/v product's rows go (cutlass_qkv_rope_kv_write): its
// first q_cols W rows are q, the next kv_cols k, the last kv_cols v. Rope of
// the interleaved style (pairs 2i, 2i + 1 of each head, the first rope_dim
// dimensions) with token t's angles angles[t * rope_dim / 2 + i] = (cos, sin)
// (CudaBackend::prepare_rope_angles); k and v rows to slot slots[t] of the
// pools ([slots, kv_cols]).
struct CutlassQkvRopeKv {
  __nv_bfloat16* q;  // [tokens, q_cols], rotated
  KvPoolLayout<__nv_bfloat16> kv;  // k and v go to their slots' rows; its head_dim is the rope's
  const float2* angles;  // [tokens, rope_dim / 2]
  const int64_t* slots;
  int q_cols, rope_dim;
};
// x @ W^T for the stacked [q; k; v] weight W (s.m = q_cols + 2 kv_cols rows,
// both multiples of 64; s.n tokens, at most kCutlassMaxRows), finished in the
// epilogue as `e` says: no product in memory. Returns false, having launched
// nothing, where it cannot take the operands.
bool cutlass_qkv_rope_kv_write(const GemmShape& s, const void* w, const void* x, const CutlassQkvRopeKv& e,
                               const CutlassLaunch& l);

// out [s.n, s.m / 2] = silu(x @ gate^T) * (x @ up^T) for an interleaved
// gate/up pair W of s.m rows (cuda_gate_up_layout.cuh; s.m a multiple of
// 64), finished in the epilogue. Returns false, having launched nothing,
// where it cannot take the operands.
bool cutlass_silu_mul(const GemmShape& s, const void* w, const void* x, __nv_bfloat16* out, const CutlassLaunch& l);

}  // namespace serval::cuda
