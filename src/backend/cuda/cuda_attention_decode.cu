// Split-KV ("FlashDecoding") attention for sequences with one new token, on
// tensor cores.
//
// A thread block serves one (sequence, KV head, split) and the query heads of
// that KV head's GQA group (up to 16; larger groups take several blocks), so
// each K/V row is read from memory once per group. The block's 4 warps take
// the split's 16-key tiles in turn. Each warp streams its tiles into its own
// two-stage shared-memory ring with cp.async (the next tile is in flight while
// it computes one), computes S = Q K^T and O^T += V^T P^T with mma.sync
// m16n8k16 (bf16 in, f32 accumulate; P goes from the first MMA's accumulators
// straight into the second's operand) and keeps its own online softmax; the
// warps are combined at the end. With one split the block writes the output;
// otherwise it leaves partials, and the last split of its (sequence, KV head)
// to finish merges them (an arrival counter), so no merge kernel runs: on the
// H200 that kernel (a boundary, and one L2 round trip per split) made the
// 8B shape's batch-1 attention at 4k contexts 16.6 us instead of 11.7. A
// sequence whose context the first split holds whole (short contexts under a
// split count planned for the longest, as CUDA graphs plan it) gets its
// output from that split, the same bits as with one split.
//
// CUDA graphs: the grid depends only on the launch shape and the split count
// (attention_decode_splits); each sequence spreads its own context over the
// splits on the device, and splits past its end exit at once.
#include <math_constants.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_attention.cuh"
#include "backend/cuda/cuda_attention_decode_rope.cuh"
#include "backend/cuda/cuda_attention_decode_tile.cuh"
#include "backend/cuda/cuda_ptx.cuh"

namespace serval::cuda {

namespace {

using namespace decode;
constexpr int kMinSplitTiles = 8;  // no split shorter than this (2 tiles per warp)
constexpr int kMaxSplits = 128;

// Tiles of each split for a sequence of n_tiles tiles: its context spread
// evenly, but no split shorter than kMinSplitTiles (a short context leaves the
// later splits empty).
__device__ __forceinline__ int split_tiles(int n_tiles, int num_splits) {
  return max(kMinSplitTiles, (n_tiles + num_splits - 1) / num_splits);
}

// A partial written by another block of this kernel, from L2 (ld.cg). As a
// volatile asm, so that the loads of a round stay ahead of their uses.
__device__ __forceinline__ float4 load_partial(const float* p) {
  float4 v;
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}

// Adds 1 to a split's arrival counter and returns the count before: a
// release of the block's partials and an acquire of the others'.
__device__ __forceinline__ int arrive(int* count) {
  int old;
  asm volatile("atom.add.acq_rel.gpu.global.s32 %0, [%1], 1;" : "=r"(old) : "l"(count) : "memory");
  return old;
}

// Shared floats of a merge: each head's split weights, then its 1 / sum.
constexpr int kMergeSmemFloats = kHeadsPerBlock * (kMaxSplits + 1);

// Writes heads h0 .. h0 + GL - 1 of (sequence s, KV head kvh) to orow from
// the partials of its `live` splits: out = sum_i w_i o_i / sum_i w_i l_i with
// w_i = 2^(m_i - max m), summed in split order. The partials come from other
// blocks through L2 (ld.cg), so every load of a round is issued before any is
// used, and the first round flies while the weights are worked out: up to
// 16 splits cost about one L2 round trip, each 16 more one more. Every thread
// of the block calls it (there is a block barrier); sm: kMergeSmemFloats.
template <int D>
__device__ void merge_splits(const AttnParams& p, int s, int kvh, int h0, int GL, int live, bf16* orow, float* sm) {
  float* w_s = sm;  // [head][split]
  float* inv_s = sm + kHeadsPerBlock * kMaxSplits;
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, G = p.group;
  const int64_t row0 = (int64_t(s) * p.kv_heads + kvh) * p.num_splits * G + h0;  // split i, head h: + i G + h
  const int64_t stride = int64_t(G) * D;  // from one split's output row to the next

  // Outputs in float4 columns (head, 4 d's). A round takes kRound splits of a
  // column; loads past the last split re-read it and weigh 0 (a weight of 0
  // adds exactly 0: the partials are finite), so no load waits on a condition.
  constexpr int kRound = 16;
  const int cols = GL * (D / 4);
  float4 v[kRound];
  auto load_round = [&](int e, int i0) {
    const float* src = p.part_out + (row0 + e / (D / 4)) * D + 4 * (e % (D / 4));
#pragma unroll
    for (int j = 0; j < kRound; ++j) v[j] = load_partial(src + min(i0 + j, live - 1) * stride);
  };
  if (tid < cols) load_round(tid, 0);  // in flight while the weights are worked out

  for (int h = warp; h < GL; h += kWarps) {
    float m_i[kMaxSplits / 32], l_i[kMaxSplits / 32], M = -CUDART_INF_F;
#pragma unroll
    for (int u = 0; u < kMaxSplits / 32; ++u) {
      const int i = lane + 32 * u;
      float2 ml = make_float2(-CUDART_INF_F, 0.0f);
      if (i < live) ml = __ldcg(reinterpret_cast<const float2*>(p.part_ml + (row0 + int64_t(i) * G + h) * 2));
      m_i[u] = ml.x;
      l_i[u] = ml.y;
      M = fmaxf(M, ml.x);
    }
    M = warp_max(M);
    float L = 0.0f;
#pragma unroll
    for (int u = 0; u < kMaxSplits / 32; ++u) {
      const int i = lane + 32 * u;
      const float w = m_i[u] == -CUDART_INF_F ? 0.0f : exp2f(m_i[u] - M);
      if (i < live) w_s[h * kMaxSplits + i] = w;
      L += w * l_i[u];
    }
    L = warp_sum(L);
    if (lane == 0) inv_s[h] = 1.0f / L;
  }
  __syncthreads();

  for (int e = tid; e < cols; e += kThreads) {
    const int h = e / (D / 4), d = 4 * (e % (D / 4));
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int i0 = 0; i0 < live; i0 += kRound) {
      if (e != tid || i0 > 0) load_round(e, i0);
#pragma unroll
      for (int j = 0; j < kRound; ++j) {
        const float w = i0 + j < live ? w_s[h * kMaxSplits + i0 + j] : 0.0f;
        acc.x = fmaf(w, v[j].x, acc.x);
        acc.y = fmaf(w, v[j].y, acc.y);
        acc.z = fmaf(w, v[j].z, acc.z);
        acc.w = fmaf(w, v[j].w, acc.w);
      }
    }
    const float inv = inv_s[h];
    __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(orow + h * D + d);
    o[0] = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
    o[1] = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
  }
}

// Shared memory of the split kernel for head_dim D: the warps' rings, with the
// combine buffer over them once they are drained.
template <int D>
struct SplitSmem : DecodeSmem<D> {
  using Base = DecodeSmem<D>;
  static constexpr int CS = Base::DP + 4;  // f32 stride of the combine rows (conflict-free)
  static constexpr int COMBINE_BYTES = kWarps * kHeadsPerBlock * CS * 4;
  static constexpr int MAIN_BYTES = Base::RING_BYTES > COMBINE_BYTES ? Base::RING_BYTES : COMBINE_BYTES;
  // After the rings (or the combine buffer over them): (m, l) per warp and
  // head, then the block's (M, L) per head, then the rope angles' cos and sin
  // (AttnRopeFold: at most D of them).
  static constexpr int ROPE_OFF = MAIN_BYTES + (kWarps + 1) * kHeadsPerBlock * 2 * 4;
  static constexpr int BYTES = ROPE_OFF + D * 4;
  static_assert(MAIN_BYTES >= kMergeSmemFloats * 4, "the merge's weights go over the rings");
};

using namespace ptx;

// The kernels are launched as programmatic dependents of the kernel before
// them (launch_pdl): every block calls pdl_wait() before reading any kernel's
// output and before writing or exiting (so that kernels after ours may rely
// on the whole chain having finished); only the host-written metadata is read
// before it.

// Fragment layouts: cuda_attention_decode_tile.cuh. kWindow (p.window > 0):
// the sequence's keys are n_ctx - window .. n_ctx - 1 (those from 0 if
// fewer); its splits divide the tiles from the one holding the first key,
// and keys before it (in that tile) are neither copied nor looked up in the
// block table (their blocks may be released) and are masked.
template <int D, int NH, bool kWindow>
__global__ void __launch_bounds__(kThreads, D <= 128 ? 3 : 1) attn_decode_kernel(AttnParams p) {
  using Sm = SplitSmem<D>;
  constexpr int DP = Sm::DP, MT = DP / 16;
  static_assert(D <= 2 * kThreads, "one rope angle per thread (rope_angle)");
  extern __shared__ __align__(16) unsigned char smem[];

  const int hb_count = head_blocks(p.group);
  const int kvh = blockIdx.x / hb_count, h0 = (blockIdx.x % hb_count) * kHeadsPerBlock;
  const int s = blockIdx.y, split = blockIdx.z;
  const int G = p.group, GL = min(kHeadsPerBlock, G - h0);  // heads h0 .. h0 + GL - 1 of the group
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  // The batch's metadata (query starts, context lengths, block tables) is
  // copied from the host before the step's first kernel, and no kernel writes
  // it: it is read, and the first tiles' keys located, while the kernel before
  // us (the rope + KV write) drains. q and the K/V pools only after pdl_wait().
  // Blocks past the first wave start after that kernel has ended, so their
  // metadata is one round of independent loads, not a chain: the context
  // length from context_len (not the query start, then its position), and
  // the first tiles' table entries beside it where the split starts at key 0.
  const int32_t* table = p.block_table + int64_t(s) * p.max_blocks_per_seq;
  auto key_index = [&](int first_tile, int i) { return (first_tile + warp + i * kWarps) * kTile + (lane & 15); };
  // A table entry for key j, read whether or not j is in the context (the
  // index is clamped to the row), so that no load waits on the context length.
  auto table_entry = [&](int j) -> int64_t { return table[min(j / p.block_size, p.max_blocks_per_seq - 1)]; };
  // (With a window the first tile's entries may be released: not read ahead.)
  int64_t entry0[kStages] = {};
  if constexpr (!kWindow) {
#pragma unroll
    for (int st = 0; st < kStages; ++st) entry0[st] = table_entry(key_index(0, st));
  }
  const int q0 = p.query_start[s];
  const bool is_decode = p.query_start[s + 1] - q0 == 1;  // else the prefill kernel serves it
  const int n_ctx = is_decode ? p.context_len[s] : 0;     // a decode's position is n_ctx - 1
  const int n_tiles = (n_ctx + kTile - 1) / kTile;
  // The window's first key, and its tile: the splits share tiles tile_lo ..
  const int key_lo = kWindow ? max(0, n_ctx - p.window) : 0;
  const int tile_lo = kWindow ? key_lo / kTile : 0;
  const int tps = split_tiles(n_tiles - tile_lo, p.num_splits);
  const int live = (n_tiles - tile_lo + tps - 1) / tps;  // the first splits hold keys; the rest are empty
  const int tile0 = tile_lo + split * tps, tile_end = min(n_tiles, tile0 + tps);
  const int64_t part_row = ((int64_t(s) * p.kv_heads + kvh) * p.num_splits + split) * G + h0;
  // This warp's tiles: tile0 + warp, + kWarps, ... below tile_end.
  const int nt = max(0, (tile_end - tile0 - warp + kWarps - 1) / kWarps);

  // Lane L (and L + 16) finds the pool offset of key L of the warp's i-th tile
  // (-1 past the context); the loads' lanes take it by shuffle.
  const int64_t slot_stride = int64_t(p.kv_heads) * D, head_off = int64_t(kvh) * D;
  auto offset_of = [&](int i, int j, int64_t blk) -> int64_t {
    if (i >= nt || j >= n_ctx || (kWindow && j < key_lo)) return -1;
    return (blk * p.block_size + j % p.block_size) * slot_stride + head_off;
  };
  // With a window, keys before key_lo look up key_lo's entry (never used).
  auto window_entry = [&](int j) { return table_entry(kWindow ? max(j, key_lo) : j); };
  auto key_offset = [&](int i) {
    const int j = key_index(tile0, i);
    return offset_of(i, j, window_entry(j));
  };
  int64_t first[kStages];
#pragma unroll
  for (int st = 0; st < kStages; ++st) {
    const int j = key_index(tile0, st);
    first[st] = offset_of(st, j, !kWindow && tile0 == 0 ? entry0[st] : window_entry(j));
  }
  unsigned char* ring_p = smem + warp * kStages * Sm::STAGE_BYTES;
  const WarpRing<D> ring{smem_u32(ring_p)};
  ring.zero_padding(ring_p, lane);
  // Keys before this step's token were written by earlier steps: the kernel
  // before us writes only the new key and value, and it started after every
  // kernel before it had finished. So, when the whole grid is resident
  // (p.early_kv), the warp's first tiles that end before the new key are
  // copied now, while that kernel drains (one cp.async group per slot, in slot
  // order; prime_ring issues the rest after the wait). With more blocks than
  // slots, the first wave's early copies only delay the kernel before (64
  // sequences: -0.7%).
  int early = 0;
#pragma unroll
  for (int st = 0; st < kStages; ++st)
    if (p.early_kv && st == early && st < nt && (tile0 + warp + st * kWarps + 1) * kTile < n_ctx) {
      ring.issue(st, first[st], lane, p.k_pool, p.v_pool);
      cp_async_commit();
      ++early;
    }
  const bool fold = p.fold.inv_freq != nullptr;  // the same for every block
  float* rope_cs = reinterpret_cast<float*>(smem + Sm::ROPE_OFF);
  const float freq = fold && tid < p.fold.rope_dim / 2 ? p.fold.inv_freq[tid] : 0.0f;
  pdl_wait();
  if (p.launch_dependents_early) pdl_launch_dependents();
  if (!is_decode) return;
  // The first split holds the whole context (a short one, under a split
  // count planned for the longest): it writes the output itself.
  const bool whole = p.whole_split_direct && live == 1;
  if (tile0 >= n_tiles) return;  // past this sequence's context: nothing to merge
  uint32_t qa[DP / 16][4];
  // With the rope folded in, the warp whose tiles include the new key (the
  // sequence's last) patches it in at its step `patch_step`; -1: none.
  const int last_in_block = n_tiles - 1 - tile0;
  const int patch_step =
      fold && tile_end == n_tiles && last_in_block % kWarps == warp ? last_in_block / kWarps : -1;
  NewKeyPatch<D> new_key;
  if (!fold) {
    load_q<D, NH>(qa, p.q + (int64_t(q0) * p.num_heads + int64_t(kvh) * G + h0) * D, GL, g, t);
    prime_ring(ring, first, nt, lane, p.k_pool, p.v_pool, early);
  } else {
    // The tiles first: the angles, q's and the new key's loads are worked
    // out while they fly.
    prime_ring(ring, first, nt, lane, p.k_pool, p.v_pool, early);
    rope_angle(rope_cs, tid, n_ctx - 1, freq, p.fold.rope_dim / 2);
    __syncthreads();
    load_q_rope<D, NH>(qa, p.fold.q + int64_t(q0) * p.fold.q_stride + (int64_t(kvh) * G + h0) * D, GL, g, t,
                       rope_cs, p.fold);
    if (patch_step >= 0) {
      const int64_t src = int64_t(q0) * p.fold.kv_stride + int64_t(kvh) * D;
      const int64_t dst = kv_offset(p.fold.slots[q0], kvh, p.kv_heads, D);
      new_key.make(p.fold.k + src, p.fold.v + src, p.fold.k_pool + dst, p.fold.v_pool + dst, lane, rope_cs, p.fold);
    }
  }
  int64_t pending = key_offset(kStages);  // the next tile's offsets, loaded one tile ahead

  WarpState<D, NH> st;
  st.reset();
  const uint32_t lds_off = ldmatrix_offset<D>(lane);
  for (int i = 0; i < nt; ++i) {
    cp_async_wait<kStages - 1>();  // this lane's copies of tile i have landed
    __syncwarp();                  // ... and every lane's
    if (i == patch_step) {
      new_key.patch(ring_p + (i % kStages) * Sm::STAGE_BYTES, (n_ctx - 1) % kTile, lane);
      __syncwarp();
    }
    const uint32_t ks = ring.base + (i % kStages) * Sm::STAGE_BYTES + lds_off;
    st.template step<kWindow>(qa, ks, ks + Sm::TILE_ELEMS * 2, (tile0 + warp + i * kWarps) * kTile, n_ctx,
                              p.scale_log2, t, key_lo);
    __syncwarp();  // every lane is done with this stage before it is refilled
    if (i + kStages < nt) ring.issue(i % kStages, pending, lane, p.k_pool, p.v_pool);
    cp_async_commit();
    pending = key_offset(i + kStages + 1);
  }
  cp_async_wait<0>();
  float(&m)[NH] = st.m;
  float(&l)[NH] = st.l;
  float(&acc)[NH][MT][4] = st.acc;

  // Combine the warps: each scales its accumulators to the block's max per
  // head and leaves them in shared memory (over the rings); then the block sums.
  float* ml_s = reinterpret_cast<float*>(smem + Sm::MAIN_BYTES);  // [warp][head] (m, l)
  float* fin_s = ml_s + kWarps * kHeadsPerBlock * 2;              // [head] (M, L)
  st.reduce_l();
#pragma unroll
  for (int r = 0; r < NH; ++r) {
    if (t == 0) {
      ml_s[(warp * kHeadsPerBlock + g + 8 * r) * 2] = m[r];
      ml_s[(warp * kHeadsPerBlock + g + 8 * r) * 2 + 1] = l[r];
    }
  }
  __syncthreads();  // all warps are past their rings, and (m, l) are visible

  auto warp_weight = [&](int w, int h, float M) {
    const float mw = ml_s[(w * kHeadsPerBlock + h) * 2];
    return mw == -CUDART_INF_F ? 0.0f : exp2f(mw - M);  // a warp without tiles weighs nothing
  };
  auto block_max = [&](int h) {
    float M = -CUDART_INF_F;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, ml_s[(w * kHeadsPerBlock + h) * 2]);
    return M;
  };
  float* comb = reinterpret_cast<float*>(smem);  // [warp][head][CS]
#pragma unroll
  for (int r = 0; r < NH; ++r)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int h = 8 * r + 2 * t + c;
      const float w = warp_weight(warp, h, block_max(h));
      float* row = comb + (warp * kHeadsPerBlock + h) * Sm::CS + g;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        row[16 * mt] = acc[r][mt][c] * w;
        row[16 * mt + 8] = acc[r][mt][2 + c] * w;
      }
    }
  if (tid < 8 * NH) {
    const float M = block_max(tid);
    float L = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) L += ml_s[(w * kHeadsPerBlock + tid) * 2 + 1] * warp_weight(w, tid, M);
    fin_s[tid * 2] = M;
    fin_s[tid * 2 + 1] = L;
  }
  __syncthreads();

  // Pairs of d per thread; rows of the output (or partials) are contiguous in d.
  const bool direct = p.num_splits == 1 || whole;
  bf16* orow = p.out + (int64_t(q0) * p.num_heads + int64_t(kvh) * G + h0) * D;
  for (int e = tid; e < GL * (D / 2); e += kThreads) {
    const int h = e / (D / 2), d = 2 * (e % (D / 2));
    float2 o = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float2 v = *reinterpret_cast<const float2*>(comb + (w * kHeadsPerBlock + h) * Sm::CS + d);
      o.x += v.x;
      o.y += v.y;
    }
    if (direct) {
      const float inv = 1.0f / fin_s[h * 2 + 1];
      *reinterpret_cast<__nv_bfloat162*>(orow + h * D + d) = __floats2bfloat162_rn(o.x * inv, o.y * inv);
    } else {
      *reinterpret_cast<float2*>(p.part_out + (part_row + h) * D + d) = o;
    }
  }
  if (!direct && tid < GL) {
    p.part_ml[(part_row + tid) * 2] = fin_s[tid * 2];
    p.part_ml[(part_row + tid) * 2 + 1] = fin_s[tid * 2 + 1];
  }
  if (direct) return;

  // The last of the sequence's live splits to get here merges them. The
  // block's partials are ordered before its count by the barrier and the
  // count's release; the last block's reads after the count by its acquire
  // and the barrier. The counter goes back to zero for the next launch.
  __shared__ int last;
  __syncthreads();  // also: every thread is done with the combine buffer the merge reuses
  if (tid == 0) {
    int* count = p.merge_count + int64_t(s) * gridDim.x + blockIdx.x;
    last = arrive(count) == live - 1;
    if (last) *count = 0;
  }
  __syncthreads();
  if (!last) return;
  merge_splits<D>(p, s, kvh, h0, GL, live, orow, reinterpret_cast<float*>(smem));
}

// Blocks of one instantiation that an SM holds at once (set up once per
// device, so that calls under stream capture touch nothing but the launch).
template <int D, int NH, bool kWindow = false>
int resident_blocks() {
  static PerDevice<int> per_sm;
  int dev = 0;
  SERVAL_CUDA_CHECK(cudaGetDevice(&dev));
  return per_sm.get(dev, [] {
    constexpr int smem = SplitSmem<D>::BYTES;
    const auto kernel = attn_decode_kernel<D, NH, kWindow>;
    if (smem > 48 * 1024)
      SERVAL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    // K/V bypass L1 (cp.async.cg): give the SM's memory to shared, for occupancy.
    SERVAL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                           int(cudaSharedmemCarveoutMaxShared)));
    int n = 0;
    SERVAL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, smem));
    return std::max(n, 1);
  });
}

// The same for the instantiation that serves p (0: no kernel for its head_dim).
int resident_blocks_for(const AttnParams& p) {
  int per_sm = 0;
  with_head_dim(p.head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    if (p.window > 0)
      per_sm = two_head_tiles(p.group) ? resident_blocks<D, 2, true>() : resident_blocks<D, 1, true>();
    else
      per_sm = two_head_tiles(p.group) ? resident_blocks<D, 2>() : resident_blocks<D, 1>();
  });
  return per_sm;
}

template <int D, int NH, bool kWindow>
void launch_decode(const AttnParams& p, const Launch& on) {
  resident_blocks<D, NH, kWindow>();  // sets the shared-memory limit on first use
  const dim3 grid(unsigned(p.kv_heads * head_blocks(p.group)), unsigned(p.num_seqs), unsigned(p.num_splits));
  // Programmatic dependent launches: the kernels wait for the previous one
  // (griddepcontrol.wait) first thing.
  launch_pdl(attn_decode_kernel<D, NH, kWindow>, grid, dim3(kThreads), size_t(SplitSmem<D>::BYTES), on, p);
}

}  // namespace

namespace {

// Split only while the blocks of the batch (`base`) fill less than ~a wave of
// `slots`. Among the split counts up to max_splits, take the fewest that reach
// 85% of the best wave efficiency (blocks / (resident slots x whole waves)), as
// FlashAttention's heuristic does.
int splits_for(int64_t base, int64_t slots, int max_splits) {
  if (max_splits <= 1 || base * 5 >= slots * 4) return 1;
  auto efficiency = [&](int splits) {
    const double waves = double(base * splits) / double(slots);
    return waves / std::ceil(waves);
  };
  double best = 0.0;
  for (int n = 1; n <= max_splits; ++n) best = std::max(best, efficiency(n));
  for (int n = 1; n <= max_splits; ++n)
    if (efficiency(n) >= 0.85 * best) return n;
  return 1;
}

}  // namespace

int attention_decode_splits(const AttnParams& p, int max_context_bound, int num_sms) {
  const int per_sm = resident_blocks_for(p);
  if (per_sm == 0) return 1;  // no kernel for this head_dim: the launch reports it
  // Never splits shorter than kMinSplitTiles of the bound. A window's keys
  // span at most window + kTile - 1 positions of whole tiles.
  if (p.window > 0) max_context_bound = int(std::min<int64_t>(max_context_bound, int64_t(p.window) + kTile));
  const int bound_tiles = ceil_div(std::max(max_context_bound, 1), kTile);
  return splits_for(int64_t(p.num_seqs) * p.kv_heads * head_blocks(p.group), int64_t(per_sm) * std::max(num_sms, 1),
                    std::min(kMaxSplits, ceil_div(bound_tiles, kMinSplitTiles)));
}

void attention_decode_split_scratch_bound(const AttnParams& p, int num_sms, int64_t& partial_floats,
                                          int64_t& merge_counters) {
  partial_floats = merge_counters = 0;
  // A windowed layer's bound covers the kernel without a window too, so that
  // one scratch serves a model of windowed and full layers (a model without
  // windows never touches the windowed kernels).
  AttnParams full = p;
  full.window = 0;
  const int per_sm = std::max(resident_blocks_for(p), resident_blocks_for(full));
  if (per_sm == 0) return;
  const int64_t slots = int64_t(per_sm) * std::max(num_sms, 1);
  const int64_t per_seq = int64_t(p.kv_heads) * head_blocks(p.group);
  // Past 80% of a wave nothing splits, so the batch sizes to try end there.
  for (int64_t seqs = 1; seqs * per_seq * 5 < slots * 4; ++seqs) {
    for (int max_splits = 2; max_splits <= kMaxSplits; ++max_splits) {
      const int n = splits_for(seqs * per_seq, slots, max_splits);
      if (n == 1) continue;
      partial_floats = std::max(partial_floats, seqs * p.kv_heads * n * p.group * (p.head_dim + 2));
      merge_counters = std::max(merge_counters, seqs * per_seq);
    }
  }
}

bool attention_decode_early_kv(const AttnParams& p, int num_sms) {
  const int64_t blocks = int64_t(p.num_seqs) * p.kv_heads * head_blocks(p.group) * p.num_splits;
  return blocks <= int64_t(resident_blocks_for(p)) * num_sms;
}

int64_t attention_decode_partial_floats(const AttnParams& p) {
  return int64_t(p.num_seqs) * p.kv_heads * p.num_splits * p.group * (p.head_dim + 2);
}

int64_t attention_decode_merge_counters(const AttnParams& p) {
  return int64_t(p.num_seqs) * p.kv_heads * head_blocks(p.group);
}

bool launch_attention_decode(const AttnParams& p, const Launch& on) {
  SERVAL_CHECK(p.num_splits >= 1 && p.num_splits <= kMaxSplits, "decode attention: ", p.num_splits, " splits");
  SERVAL_CHECK(p.num_splits == 1 || (p.part_out != nullptr && p.merge_count != nullptr),
               "decode attention: ", p.num_splits, " splits need partials and merge counters");
  return with_head_dim(p.head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    const bool windowed = p.window > 0;
    if (two_head_tiles(p.group))
      windowed ? launch_decode<D, 2, true>(p, on) : launch_decode<D, 2, false>(p, on);
    else
      windowed ? launch_decode<D, 1, true>(p, on) : launch_decode<D, 1, false>(p, on);
  });
}

}  // namespace serval::cuda

namespace serval {

// The head sizes the decode kernels are compiled for (with_head_dim); the
// prefill and f32 kernels take the same ones.
bool cuda_attention_supports_head_dim(int64_t head_dim) {
  return head_dim > 0 && head_dim <= 1024 && cuda::decode::with_head_dim(int(head_dim), [](auto) {});
}

}  // namespace serval
