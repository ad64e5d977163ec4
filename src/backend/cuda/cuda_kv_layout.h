#pragma once
// Where the paged KV cache keeps a token's keys and values: one layer's K pool
// and V pool, each [slots, kv_heads, head_dim] in the KV dtype, a slot being
// block_table[p / block_size] * block_size + p % block_size for position p of
// a sequence (the scheduler's slot mapping). Every kernel that writes K/V
// (kv_write, the rope + KV write kernel, the q/k/v GEMV's and CUTLASS's
// epilogues, the decode kernel's rope fold) and the attention kernels that
// read them find an element through kv_offset. Plain C++ and CUDA, without
// the Backend headers: CUTLASS's files include it.
#include <cstdint>

#if defined(__CUDACC__)
#define SERVAL_KV_HD __host__ __device__ __forceinline__
#else
#define SERVAL_KV_HD inline
#endif

namespace serval::cuda {

// The offset of (slot, head) in a pool of kv_heads heads of head_dim; the
// token's heads lie back to back, so its whole row starts at head 0.
SERVAL_KV_HD int64_t kv_offset(int64_t slot, int head, int kv_heads, int head_dim) {
  return (slot * kv_heads + head) * head_dim;
}

// One layer's pools as the writers see them.
template <typename T>
struct KvPoolLayout {
  T* k = nullptr;
  T* v = nullptr;
  int kv_heads = 0, head_dim = 0;
  // Elements of one token's row (all its heads).
  SERVAL_KV_HD int64_t row() const { return int64_t(kv_heads) * head_dim; }
  // The start of `slot`'s row, head `head`, in the K (value: false) or V pool.
  SERVAL_KV_HD T* at(bool value, int64_t slot, int head = 0) const {
    return (value ? v : k) + kv_offset(slot, head, kv_heads, head_dim);
  }
};

}  // namespace serval::cuda
