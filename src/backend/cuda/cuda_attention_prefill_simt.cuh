#pragma once
// The CUDA-core prefill attention kernel (cuda_attention_prefill_simt.cu),
// which launch_attention_prefill uses for head dims that have no tensor-core
// kernel.
#include "backend/cuda/cuda_attention.cuh"

namespace serval::cuda {

// Returns false if head_dim has no compiled kernel (compiled: 8, 16, 32, 80, 96, 256).
bool launch_attention_prefill_simt(const AttnParams& p, int max_query_len, cudaStream_t stream);

}  // namespace serval::cuda
