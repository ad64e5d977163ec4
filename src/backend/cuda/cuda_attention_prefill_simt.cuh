#pragma once
// The CUDA-core attention kernel (cuda_attention_prefill_simt.cu): in bf16,
// the prefill kernel for head dims that have no tensor-core kernel
// (launch_attention_prefill uses it); in f32 (--dtype float32), the attention
// kernel for every row.
#include "backend/cuda/cuda_attention.cuh"

namespace serval::cuda {

// Sequences with several new tokens only. Returns false if head_dim has no
// compiled kernel (compiled: 8, 16, 32, 80, 96, 256).
bool launch_attention_prefill_simt(const AttnParams& p, int max_query_len, cudaStream_t stream);

// Every sequence, prefill and decode alike, in f32 (p.num_splits is ignored).
// Returns false if head_dim has no compiled kernel (compiled: 8, 16, 32, 64,
// 80, 96, 128, 256).
bool launch_attention_f32(const AttnParamsT<float>& p, int max_query_len, cudaStream_t stream);

}  // namespace serval::cuda
