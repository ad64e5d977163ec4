#pragma once
// Decode GEMMs through CUTLASS's Hopper kernel (cuda_cutlass_gemm.cu), for
// the products of 17..64 rows that would otherwise go to cuBLASLt.
#include <cuda_runtime.h>

#include "backend/cuda/cuda_gemm_shape.h"

namespace serval::cuda {

// Whether this build has CUTLASS (its headers were found at configure time).
bool cutlass_gemm_built();
// y = x @ W^T as `s` says (bf16 W and x; y bf16, or f32 when s.y_f32), at
// most kCutlassMaxRows rows, launched as a programmatic dependent of the
// kernel before it. Returns false, having launched nothing, where CUTLASS
// cannot take the operands (alignment) or the build has no CUTLASS.
constexpr int64_t kCutlassMaxRows = 64;  // one tile of 64 rows of x
bool cutlass_gemm(const GemmShape& s, const void* w, const void* x, void* y, cudaStream_t stream);

}  // namespace serval::cuda
