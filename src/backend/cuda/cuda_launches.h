#pragma once
// Launches of the elementwise, norm and rope kernels (cuda_elementwise.cu,
// cuda_rope.cu) that the backend's parts share: each checks what its kernel
// needs and enqueues it.
#include <cuda_runtime.h>

#include "backend/cuda/cuda_launch.h"
#include "runtime/backend.h"

namespace serval::cuda {

// out = rmsnorm(x) * w (bf16 or f32 x; out in the activation dtype, may alias x).
void launch_rmsnorm(const Tensor& x, const float* w, float eps, Tensor out, const Launch& on);
// residual (f32) += the sum of two f32 partials (`stride` floats apart, each
// [rows, cols]) rounded to bf16; out (bf16) = rmsnorm(residual) * w.
void launch_split_add_rmsnorm(const Tensor& residual, const float* partials, int64_t stride, const float* w,
                              float eps, const Tensor& out, const Launch& on);
// y [T, n] += bias [n]; y is bf16 or f32.
void add_bias(cudaStream_t stream, int sms, Tensor y, const float* bias);
// out [T, I] = silu(gate) * up of an interleaved pair's product [T, 2I] (cuda_gate_up_layout.cuh).
void launch_silu_mul_interleaved(const void* product, Tensor out, int sms, cudaStream_t stream);

// rope_kv_write whose q, k and v rows come from one stacked bf16 [T, row]
// product (q at column 0, k at k_col, v at v_col); rotated q goes to q.
void rope_kv_write_from_stacked(const void* qkv, int64_t row, int64_t k_col, int64_t v_col, Tensor q,
                                int64_t kv_cols, const int32_t* positions, const RopeParams& rope,
                                const int64_t* slot_mapping, const KvLayer& kv, const KvGeometry& geom,
                                const Launch& on);
// angles [tokens, half] = (cos, sin) of positions[t] * inv_freq[i], as the rope kernels compute them.
void launch_rope_angles(const int32_t* positions, const float* inv_freq, int64_t tokens, int half, float2* angles,
                        cudaStream_t stream);

}  // namespace serval::cuda
