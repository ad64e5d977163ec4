#pragma once
// Paged attention on the GPU: the parameters shared by the prefill kernel
// (cuda_attention_prefill.cu: sequences with several new tokens) and the
// split-KV decode kernels (cuda_attention_decode.cu: sequences with one).
// Both read K/V through the block table; both handle any GQA group size.
#include "backend/cuda/cuda_common.cuh"

namespace serval::cuda {

// Keys per shared-memory tile of the prefill kernel, and of the decode kernel
// (smaller: its occupancy is limited by shared memory and registers, and it
// needs many blocks in flight to cover memory latency).
constexpr int kAttnKeyTile = 64;
constexpr int kDecodeKeyTile = 32;

struct AttnParams {
  const bf16* q = nullptr;  // [T, num_heads * D]
  bf16* out = nullptr;      // [T, num_heads * D]
  const bf16* k_pool = nullptr;  // [blocks, block_size, kv_heads, D]
  const bf16* v_pool = nullptr;
  const int32_t* query_start = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* block_table = nullptr;
  int num_seqs = 0, num_heads = 0, kv_heads = 0, group = 0, head_dim = 0;
  int block_size = 0, max_blocks_per_seq = 0;
  float scale_log2 = 0;  // softmax scale * log2(e): the kernels use exp2
  // Split-KV decode: each split covers tiles_per_split key tiles and leaves its
  // unnormalized output [group, D] and (max, sum) per head in the partials.
  int num_splits = 1, tiles_per_split = 1;
  float* part_out = nullptr;  // [S, kv_heads, splits, group, D]
  float* part_ml = nullptr;   // [S, kv_heads, splits, group, 2]
};

// Address of key/value j of sequence s, KV head kvh, in a pool.
__device__ __forceinline__ const bf16* kv_row(const bf16* pool, const AttnParams& p, const int32_t* table, int j,
                                              int kvh) {
  const int64_t slot = int64_t(table[j / p.block_size]) * p.block_size + j % p.block_size;
  return pool + (slot * p.kv_heads + kvh) * p.head_dim;
}

// Launchers; they return false if head_dim has no compiled kernel.
bool launch_attention_prefill(const AttnParams& p, int max_query_len, cudaStream_t stream);
bool launch_attention_decode(const AttnParams& p, cudaStream_t stream);
// Shared memory the decode kernel needs, for sizing checks.
size_t attention_decode_smem(int group, int head_dim);
int attention_max_splits();

}  // namespace serval::cuda
