#pragma once
// Matmuls of quantized weights kept at their size on the GPU (GGUF Q4_0,
// Q8_0, Q4_1, Q4_K, Q5_K; int4 g32/64/128; int8 per channel), in the layout
// of backend/gpu_block_pack.h: the quantized GEMV for decode
// batches (1..16 rows of bf16 x), and a dequantizer into a bf16 matrix for
// the products of more rows (then one dense GEMM).
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_decode_matmul.h"
#include "backend/gpu_block_pack.h"
#include "runtime/backend.h"

namespace serval::cuda {

// A packed matrix on the device: one allocation, quants then scales (then mins).
struct PackedWeight {
  const uint8_t* data = nullptr;
  GpuBlockPack pack;
  const uint8_t* quants() const { return data; }
  const uint16_t* scales() const { return reinterpret_cast<const uint16_t*>(data + pack.scales_offset()); }
  const uint16_t* mins() const {
    return pack.mins ? reinterpret_cast<const uint16_t*>(data + pack.mins_offset()) : nullptr;
  }
};

// x fits the packed GEMV: bf16, 1..16 rows of w's columns, 16-byte aligned.
bool gemv_packed_fits(const Tensor& x, const PackedWeight& w);
// ys[i] = x @ ws[i]^T for 1..3 weights of one form (GpuBlockPack::same_form)
// and width in one launch (outputs bf16, or one f32 output alone). Each
// group's products are summed exactly from the quants (an mma of bf16 x and
// the integer quants), then scaled (and the min times the group's sum of x
// added) in f32: no rounding of the weights beyond the pack's own.
// With rope.positions: q/k/v, rotated and k/v written to the pools in the
// epilogue, as the bf16 GEMV does (cuda_decode_matmul.h, GemvRopeKv).
// int8_x: 1 or 2 rows of x are quantized to int8 per group of 32 columns
// (scale max|x| / 127, round to nearest even, as llama.cpp's q8_1) and
// multiplied by dp4a in integers, about half the instructions a weight of
// the mma path (cuda_gemv_packed_dp4a.cu); the result then differs from the
// exact product by x's rounding (about 1e-2 relative), and a row's bits
// depend on how many rows came with it (not for batch-invariant mode).
void gemv_packed(const Tensor& x, const PackedWeight* ws, const Tensor* ys, int n, const Launch& on,
                 const GemvRopeKv& rope = {}, bool int8_x = false);
// out = silu(x @ gate^T) * (x @ up^T), bf16, in one launch.
void gemv_packed_gated(const Tensor& x, const PackedWeight& gate, const PackedWeight& up, const Tensor& out,
                       const Launch& on, bool int8_x = false);
// out [w.rows, w.cols] = the matrix, each weight (as unpack_gpu_blocks) rounded to bf16.
void dequantize_packed(const PackedWeight& w, bf16* out, const Launch& on);

}  // namespace serval::cuda
