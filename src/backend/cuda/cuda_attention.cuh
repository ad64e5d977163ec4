#pragma once
// Paged attention on the GPU: the parameters shared by the prefill kernel
// (cuda_attention_prefill.cu: sequences with several new tokens) and the
// split-KV decode kernels (cuda_attention_decode.cu: sequences with one).
// Both read K/V through the block table; both handle any GQA group size.
// With f32 activations (--dtype float32) the CUDA-core kernel of
// cuda_attention_prefill_simt.cu serves every row instead, prefill and decode.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kv_layout.h"

namespace serval::cuda {

// Keys per shared-memory tile of the prefill kernel, and of the decode kernel
// (16: one tensor-core MMA's worth of keys per warp and step).
constexpr int kAttnKeyTile = 64;
constexpr int kDecodeKeyTile = 16;
// Most sequences a stream decode launch takes (its blocks scan them all).
constexpr int kAttnStreamMaxSeqs = 256;

// Rope and the KV write done by the split decode kernel, in a step whose rows
// are all decodes (inv_freq set): q, k and v are the projections' rows,
// unrotated. Each block rotates its heads of q; the block holding a
// sequence's new key rotates k, writes k and v to the token's slot (as
// rope_kv_write does, bit for bit) and puts them into its copy of that tile,
// which may have read the slot before the write. The kernel before attention
// is then the projection itself, one launch and boundary fewer per layer.
struct AttnRopeFold {
  const float* inv_freq = nullptr;  // [rope_dim / 2]; null: q is rotated, the new K/V are in the pools
  int rope_dim = 0;
  bool neox = false;
  const bf16 *q = nullptr, *k = nullptr, *v = nullptr;
  int64_t q_stride = 0, kv_stride = 0;  // elements from one token's row to the next
  const int64_t* slots = nullptr;       // [T]: the new tokens' slots
  bf16 *k_pool = nullptr, *v_pool = nullptr;
};

// Elem: the element type of q, out and the pools (the activation dtype).
template <typename Elem>
struct AttnParamsT {
  const Elem* q = nullptr;  // [T, num_heads * D]
  Elem* out = nullptr;      // [T, num_heads * D]
  const Elem* k_pool = nullptr;  // [blocks, block_size, kv_heads, D]
  const Elem* v_pool = nullptr;
  const int32_t* query_start = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* context_len = nullptr;  // [S]
  const int32_t* block_table = nullptr;
  int num_seqs = 0, num_heads = 0, kv_heads = 0, group = 0, head_dim = 0;
  int block_size = 0, max_blocks_per_seq = 0;
  float scale_log2 = 0;  // softmax scale * log2(e): the kernels use exp2
  // Sequences with at least this many new tokens are the prefill kernels'; the
  // rest (one token) the decode kernels'. 1 (f32, batch-invariant mode): the
  // prefill kernels take every row and no decode kernel runs.
  int min_query_len = 2;
  // Split-KV decode: the launch has num_splits splits per (sequence, KV head);
  // each sequence divides its own context among them on the device (see
  // attention_decode_splits). With more than one split, each leaves its
  // unnormalized output and its (max, sum) per head in the partials, and the
  // last split of a (sequence, KV head, head block) to finish, counted in
  // merge_count (zero between launches), merges them into `out`.
  int num_splits = 1;
  float* part_out = nullptr;  // [S, kv_heads, splits, group, D]
  float* part_ml = nullptr;   // [S, kv_heads, splits, group, 2]
  int* merge_count = nullptr;  // [S, kv_heads, head blocks]: attention_decode_merge_counters
  // Whether the decode kernel copies its first K/V tiles (those before the
  // step's new key) before waiting for the kernel before it: when the whole
  // grid is resident (attention_decode_early_kv).
  bool early_kv = false;
  // Each decode block lets the next kernel in (griddepcontrol.launch_dependents)
  // once it has waited, so the next one (the merge or the o product) is
  // launched when the last wave has started: its CTAs take the SMs the tail
  // frees and prefetch their weights while it drains. Its own griddepcontrol.wait
  // still waits for this whole grid. Set by plan_attention for split decode steps
  // of 24 rows and more (kAttnTriggerMinRows) unless CudaTuning::attn_trigger is off.
  bool launch_dependents_early = false;
  // A sequence whose context the first split holds whole gets its output from
  // that split, and the merge skips it (CudaTuning::attn_direct_split).
  bool whole_split_direct = true;
  // Stream decode (cuda_attention_decode_stream.cu), when stream_blocks > 0:
  // that many blocks share the batch's tiles; the partials hold two pieces per
  // warp ([blocks x warps x 2, min(group, 16), D] and [..., 2]) and
  // piece_ready one flag per warp, zero between launches.
  int stream_blocks = 0;
  int* piece_ready = nullptr;
  AttnRopeFold fold;  // the split kernel only (bf16)
  // Sliding window (KvGeometry::window): a query at position q attends to keys
  // max(0, q + 1 - window) .. q; 0: none. Every kernel but the stream decode
  // kernel honours it (plan_attention never picks that one under a window).
  // The window is a template flag of each kernel, chosen at launch: with 0 the
  // same kernels run as without the field (which is last, so the others keep
  // their offsets and the kernels their bytes). Table entries of blocks wholly
  // before a row's first key may be -1 (released): never read.
  int window = 0;
};
using AttnParams = AttnParamsT<bf16>;

// Address of key/value j of sequence s, KV head kvh, in a pool.
__device__ __forceinline__ const bf16* kv_row(const bf16* pool, const AttnParams& p, const int32_t* table, int j,
                                              int kvh) {
  const int64_t slot = int64_t(table[j / p.block_size]) * p.block_size + j % p.block_size;
  return pool + kv_offset(slot, kvh, p.kv_heads, p.head_dim);
}

// Launchers; they return false if head_dim has no compiled kernel.
bool launch_attention_prefill(const AttnParams& p, int max_query_len, cudaStream_t stream);
bool launch_attention_decode(const AttnParams& p, const Launch& on);

// The decode launch's split count. It depends only on the launch shape
// (num_seqs, kv_heads, group, head_dim), the SM count and `max_context_bound`
// (an upper bound of every context: under CUDA graphs the model's maximum),
// never on the real contexts, so a captured launch serves every later step.
int attention_decode_splits(const AttnParams& p, int max_context_bound, int num_sms);
// Whether a split-KV launch of this shape and p.num_splits is one wave of
// resident blocks (AttnParams::early_kv).
bool attention_decode_early_kv(const AttnParams& p, int num_sms);
// Floats of partials that a launch with p.num_splits > 1 needs, and its
// merge counters.
int64_t attention_decode_partial_floats(const AttnParams& p);
int64_t attention_decode_merge_counters(const AttnParams& p);
// The most of each that any split launch of p's heads (kv_heads, group,
// head_dim) can need, over every batch size and context bound. Scratch sized
// for them once never grows again, which would drop every recorded graph (a
// step the warm-up never saw, such as an eager mixed step, would otherwise).
void attention_decode_split_scratch_bound(const AttnParams& p, int num_sms, int64_t& partial_floats,
                                          int64_t& merge_counters);

// The stream decode kernel: its grid for this launch shape (0 where it does
// not apply: too many sequences, or no kernel for head_dim), the partials and
// flags a launch with p.stream_blocks needs, and the launch (decode rows
// only; it returns false if head_dim has no compiled kernel).
int attention_decode_stream_blocks(const AttnParams& p, int num_sms);
// Whether the stream kernel should serve this launch, for a step whose
// sequences average `mean_context` tokens (BatchView::mean_context_len).
bool attention_decode_stream_preferred(const AttnParams& p, int num_sms, int mean_context);
int64_t attention_decode_stream_partial_floats(const AttnParams& p);
int64_t attention_decode_stream_warps(const AttnParams& p);
bool launch_attention_decode_stream(const AttnParams& p, const Launch& on);

}  // namespace serval::cuda
