// CudaAttention (cuda_attention.h), and CudaBackend::qkv_attention: the
// q/k/v projection, then attention that rotates and writes the new K/V itself
// where it can.
#include <algorithm>
#include <climits>
#include <cmath>

#include "backend/cuda/cuda_attention.cuh"
#include "backend/cuda/cuda_attention_decode_tile.cuh"
#include "backend/cuda/cuda_attention_prefill_simt.cuh"
#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_launches.h"

namespace serval::cuda {

namespace {

// Decode attention triggers its dependents early from this many rows (plan_attention).
constexpr int64_t kAttnTriggerMinRows = 24;

template <typename T>
AttnParamsT<T> attn_params(const Tensor& q, const KvLayer& kv, const KvGeometry& g, const BatchView& b,
                           int32_t num_heads, float scale, const Tensor& out) {
  AttnParamsT<T> p;
  p.q = static_cast<const T*>(q.data);
  p.out = static_cast<T*>(out.data);
  p.k_pool = static_cast<const T*>(kv.k.data());
  p.v_pool = static_cast<const T*>(kv.v.data());
  p.query_start = b.query_start;
  p.positions = b.positions;
  p.context_len = b.context_len;
  p.block_table = b.block_table;
  p.num_seqs = b.num_seqs;
  p.num_heads = num_heads;
  p.kv_heads = g.num_kv_heads;
  p.group = num_heads / g.num_kv_heads;
  p.head_dim = g.head_dim;
  p.block_size = g.block_size;
  p.max_blocks_per_seq = b.max_blocks_per_seq;
  p.scale_log2 = float(double(scale) * 1.4426950408889634);
  p.window = int(std::min<int64_t>(g.window, INT32_MAX));
  return p;
}

}  // namespace

void CudaAttention::paged(const Tensor& q, const KvLayer& kv, const KvGeometry& g, const BatchView& b,
                          int32_t num_heads, float scale, Tensor out) {
  SERVAL_CHECK(q.dtype == cfg_.act_dtype && out.dtype == cfg_.act_dtype, "paged_attention: expects ",
               dtype_name(cfg_.act_dtype), " q and out");
  SERVAL_CHECK(g.num_kv_heads > 0 && num_heads % g.num_kv_heads == 0, "paged_attention: ", num_heads,
               " query heads do not divide into ", g.num_kv_heads, " KV heads");
  if (b.num_tokens == 0 || b.num_seqs == 0) return;

  if (cfg_.act_dtype == DType::F32) {
    // One launch over every sequence; its grid follows b.max_query_len (1 for
    // a decode step, so a captured decode launch serves every replay).
    AttnParamsT<float> p = attn_params<float>(q, kv, g, b, num_heads, scale, out);
    p.min_query_len = 1;
    SERVAL_CHECK(launch_attention_f32(p, std::max(b.max_query_len, 1), dev_.stream()), "paged_attention: head_dim ",
                 p.head_dim, " has no f32 CUDA kernel (compiled: 8, 16, 32, 64, 80, 96, 128, 256)");
    return;
  }

  if (cfg_.batch_invariant) {
    AttnParams p = attn_params<bf16>(q, kv, g, b, num_heads, scale, out);
    // Every row through the prefill kernels: a row's keys run in fixed tiles
    // from position 0 there, whatever its batch, chunk or query length, where
    // the decode kernels' splits follow the batch.
    p.min_query_len = 1;
    SERVAL_CHECK(launch_attention_prefill(p, std::max(b.max_query_len, 1), dev_.stream()), "paged_attention: head_dim ",
                 p.head_dim, " has no CUDA kernel (compiled: 8, 16, 32, 64, 80, 96, 128, 256)");
    return;
  }
  launch(plan(q, kv, g, b, num_heads, scale, out), b);
}

AttnParams CudaAttention::plan(const Tensor& q, const KvLayer& kv, const KvGeometry& g, const BatchView& b,
                               int32_t num_heads, float scale, const Tensor& out) {
  AttnParams p = attn_params<bf16>(q, kv, g, b, num_heads, scale, out);
  plan_decode(p, b);
  return p;
}

void CudaAttention::plan_decode(AttnParams& p, const BatchView& b) {
  SERVAL_CHECK(b.context_len != nullptr, "paged_attention: the batch has no context_len");
  const CudaTuning& tuning = cfg_.tuning;
  const int sms = dev_.num_sms();
  p.whole_split_direct = tuning.attn_direct_split;
  // b.max_context_len may be an upper bound (CUDA graphs): the split count and
  // the partials' size follow from it and the shape only, so the eager step
  // that precedes a capture sizes the scratch for every replay.
  p.num_splits = attention_decode_splits(p, b.max_context_len, sms);
  // The stream kernel has no window: windowed layers always take the split kernel.
  if (p.window == 0 && (tuning.attn_stream == CudaTuning::AttnStream::kAlways ||
                        (tuning.attn_stream == CudaTuning::AttnStream::kAuto &&
                         attention_decode_stream_preferred(p, sms, b.mean_context_len))))
    p.stream_blocks = attention_decode_stream_blocks(p, sms);
  if (p.stream_blocks > 0) {
    ++stream_calls_;
    p.num_splits = 1;
    p.piece_ready = static_cast<int*>(dev_.scratch(piece_ready_, attention_decode_stream_warps(p) * 4));
  }
  const int64_t floats = p.stream_blocks > 0  ? attention_decode_stream_partial_floats(p)
                         : p.num_splits > 1 ? attention_decode_partial_floats(p)
                                            : 0;
  const int64_t counters = p.stream_blocks == 0 && p.num_splits > 1 ? attention_decode_merge_counters(p) : 0;
  int64_t part_bytes = floats * 4, count_bytes = counters * 4;
  if (counters > 0 && (partials_.bytes() < part_bytes || merge_count_.bytes() < count_bytes)) {
    // Grown at once to what any split launch of these heads needs.
    int64_t most_floats = 0, most_counters = 0;
    attention_decode_split_scratch_bound(p, sms, most_floats, most_counters);
    part_bytes = std::max(floats, most_floats) * 4;
    count_bytes = std::max(counters, most_counters) * 4;
  }
  if (floats > 0) {
    float* part = static_cast<float*>(dev_.scratch(partials_, part_bytes));
    p.part_out = part;
    p.part_ml = part + floats / (p.head_dim + 2) * p.head_dim;
  }
  if (p.stream_blocks == 0) {
    p.early_kv = attention_decode_early_kv(p, sms);
    // From 24 rows only: below, the 7B's steps lost with it.
    p.launch_dependents_early = tuning.attn_trigger && b.num_tokens >= kAttnTriggerMinRows;
    if (counters > 0) p.merge_count = static_cast<int*>(dev_.scratch(merge_count_, count_bytes));
  }
}

void CudaAttention::launch(const AttnParams& p, const BatchView& b) {
  bool ok = true;
  if (b.max_query_len > 1) ok = launch_attention_prefill(p, b.max_query_len, dev_.stream());
  const Launch on = launch_on(dev_, cfg_);
  if (ok) ok = p.stream_blocks > 0 ? launch_attention_decode_stream(p, on) : launch_attention_decode(p, on);
  if (ok && p.fold.inv_freq != nullptr) ++rope_folded_calls_;
  SERVAL_CHECK(ok, "paged_attention: head_dim ", p.head_dim,
               " has no CUDA kernel (compiled: 8, 16, 32, 64, 80, 96, 128, 256)");
}

bool CudaAttention::rope_fold_fits(const Tensor& x, const Tensor& q, const RopeParams& rope, const KvGeometry& geom,
                                   const BatchView& b) const {
  const int D = geom.head_dim;
  return cfg_.act_dtype == DType::BF16 && !cfg_.batch_invariant && x.dtype == DType::BF16 &&
         b.max_query_len == 1 && b.num_tokens == b.num_seqs && x.rows == b.num_tokens && b.num_tokens > 0 &&
         b.slot_mapping != nullptr && q.dtype == DType::BF16 && rope.inv_freq != nullptr && rope.head_dim == D &&
         D % 8 == 0 && rope.rope_dim > 0 && rope.rope_dim <= D &&
         rope.rope_dim % (rope.style == RopeStyle::Neox ? 16 : 2) == 0 && decode::with_head_dim(D, [](auto) {});
}

// Steps of decodes only (graphs record them) whose projection leaves the rope
// to a kernel after it: 17 rows and up, or NeoX rope below; by default only
// CUTLASS's rows past its rope epilogue's (CudaTuning::rope_in_attn). The
// fold's own test first: with it off (the default), the GEMV's is left to
// qkv_rope_kv_write alone rather than made twice per layer.
void CudaBackend::qkv_attention(const NormedRows& xn, const DeviceWeight& wq, const DeviceWeight& wk,
                                const DeviceWeight& wv, Tensor q, Tensor k, Tensor v, const RopeParams& rope,
                                const KvLayer& kv, const KvGeometry& geom, const BatchView& b, int32_t num_heads,
                                float scale, Tensor out) {
  // A quantized pool: projection, rope + kv_write, attention_over_codes, each apart.
  if (kv_dtype_quantized(geom.dtype))
    return Backend::qkv_attention(xn, wq, wk, wv, q, k, v, rope, kv, geom, b, num_heads, scale, out);
  const CudaWeight &cq = as_cuda(wq), &ck = as_cuda(wk), &cv = as_cuda(wv);
  const Tensor& xr = xn.rows;
  const CudaTuning::RopeInAttn mode = cfg_.tuning.rope_in_attn;
  const bool wanted = mode == CudaTuning::RopeInAttn::kOn ||
                      (mode == CudaTuning::RopeInAttn::kAuto && matmul_.cutlass_rows(xr.rows) &&
                       !matmul_.cutlass_rope_rows(xr.rows));
  if (!wanted || !attention_.rope_fold_fits(xr, q, rope, geom, b) ||
      matmul_.gemv_rope_fits(xr, cq, ck, cv, q, k, v, rope, geom))
    return Backend::qkv_attention(xn, wq, wk, wv, q, k, v, rope, kv, geom, b, num_heads, scale, out);
  SERVAL_CHECK(out.dtype == DType::BF16 && geom.num_kv_heads > 0 && num_heads % geom.num_kv_heads == 0,
               "qkv_attention: ", num_heads, " query heads do not divide into ", geom.num_kv_heads, " KV heads");
  dev_.bind();
  const Tensor x = matmul_.normalized(xn);
  // The projection's rows, unrotated: one stacked product, or q, k and v.
  const bool stacked = matmul_.stacked_qkv_fits(x, cq, ck, cv, q, rope, geom);
  const int64_t row = cq.rows() + ck.rows() + cv.rows();
  const bf16* qkv = nullptr;
  if (stacked)
    qkv = matmul_.stacked_qkv(x, cq, ck, cv);
  else
    matmul_.matmul_multi(x, {&wq, &wk, &wv}, {q, k, v});

  AttnParams p = attention_.plan(q, kv, geom, b, num_heads, scale, out);
  if (p.stream_blocks > 0) {  // the stream kernel reads every key from the pools
    if (stacked)
      rope_kv_write_from_stacked(qkv, row, cq.rows(), cq.rows() + ck.rows(), q, ck.rows(), b.positions, rope,
                                 b.slot_mapping, kv, geom, launch_on(dev_, cfg_));
    else
      rope_kv_write(q, k, v, b.positions, rope, b.slot_mapping, kv, geom);
    return attention_.launch(p, b);
  }
  AttnRopeFold& f = p.fold;
  f.inv_freq = rope.inv_freq;
  f.rope_dim = rope.rope_dim;
  f.neox = rope.style == RopeStyle::Neox;
  f.q = stacked ? qkv : static_cast<const bf16*>(q.data);
  f.k = stacked ? qkv + cq.rows() : static_cast<const bf16*>(k.data);
  f.v = stacked ? qkv + cq.rows() + ck.rows() : static_cast<const bf16*>(v.data);
  f.q_stride = stacked ? row : q.cols;
  f.kv_stride = stacked ? row : k.cols;
  f.slots = b.slot_mapping;
  f.k_pool = static_cast<bf16*>(kv.k.data());
  f.v_pool = static_cast<bf16*>(kv.v.data());
  // Rows and chunks of 16 bytes (the new key's copies), which every product here gives.
  SERVAL_CHECK(f.q_stride % 2 == 0 && f.kv_stride % 8 == 0 && reinterpret_cast<uintptr_t>(f.k) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(f.v) % 16 == 0,
               "qkv_attention: q/k/v rows are not 16-byte aligned");
  attention_.launch(p, b);
}

}  // namespace serval::cuda
