#pragma once
// A Tensor's data as the CUDA kernels read it. (Kept out of cuda_common.cuh,
// which CUTLASS's files include: serval::Tensor would meet cute's Tensor.)
#include "backend/cuda/cuda_common.cuh"
#include "runtime/backend.h"

namespace serval::cuda {

inline bf16* bf(const Tensor& t) { return static_cast<bf16*>(t.data); }

}  // namespace serval::cuda
