#pragma once
// The rotation of one rope pair, shared by every kernel that applies rope (the
// rope kernels of cuda_rope.cu and the q/k/v GEMV's epilogue), so that they
// give the same bits: the products are rounded on their own (__fmul_rn), which
// leaves ptxas no multiply-add to contract one way in one kernel and another
// way in the next.
namespace serval::cuda {

__device__ __forceinline__ void rope_rotate(float a, float b, float cs, float sn, float& ra, float& rb) {
  ra = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
  rb = __fadd_rn(__fmul_rn(b, cs), __fmul_rn(a, sn));
}

}  // namespace serval::cuda
