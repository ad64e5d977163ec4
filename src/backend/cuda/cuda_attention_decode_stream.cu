// Decode attention as one stream of tiles ("stream-K" over the KV), for
// batches of many long (sequence, KV head) items: the split-KV kernel runs them
// as blocks in waves, each wave starting and draining its loads together.
//
// The grid is exactly resident (blocks per SM x SMs), and the batch's 16-key
// tiles, item after item, are cut into one equal run per warp. A warp streams
// its run through its own ring without stopping at item boundaries: while it
// finishes one item, the next item's first tiles are already in flight. An
// item inside one warp's run is written by that warp. An item cut between runs
// starts in some warp's run and continues at the start of the next ones: each
// later warp publishes its piece (max, sum, output) as soon as it has it (a
// flag per warp), and the warp where the item starts, whose piece ends its
// run, merges them after it, so no second kernel runs and nothing waits on a
// counter in the middle of a run. The merger clears the flags it read.
//
// All blocks of the grid are resident at once (its size is the occupancy), so
// a merger waiting for a later warp's flag always sees it come. (Not so if
// another process takes SMs for good, as MPS with a thread limit can:
// --cuda-tuning attn_stream=off there.)
//
// CUDA graphs: the grid depends only on the GPU and the launch shape; the
// runs follow the contexts of each replay (every block scans them first).
#include <math_constants.h>

#include <algorithm>

#include "backend/cuda/cuda_attention.cuh"
#include "backend/cuda/cuda_attention_decode_tile.cuh"
#include "backend/cuda/cuda_ptx.cuh"
#include "runtime/backend.h"

namespace serval::cuda {

namespace {

using namespace decode;
using namespace ptx;

// Shared memory: the warps' rings, then per sequence its first tile in the
// batch's order (the prefix of tiles x items, one entry past the last), its
// context and its query row.
template <int D>
struct StreamSmem : DecodeSmem<D> {
  static constexpr int SCAN_BYTES = (3 * kAttnStreamMaxSeqs + 1) * 4;
  static constexpr int BYTES = DecodeSmem<D>::RING_BYTES + SCAN_BYTES;
};

// The flags' accesses: a release store after the piece's writes, an acquire
// load before the merger reads them.
__device__ __forceinline__ void st_release(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Where a warp is in the batch's tiles: sequence s, item it (KV head x head
// block) of that sequence, tile j of the item.
struct Cursor {
  int s, it, j, n_ctx, n_tiles;
};

struct Scan {
  const int* pre;  // [S + 1] first tile of each sequence
  const int* ctx;  // [S] context (0: not a decode row)
  const int* q0;   // [S] query row
  int S, items;    // sequences, items per sequence

  __device__ __forceinline__ Cursor locate(int64_t tile) const {
    int lo = 0, hi = S;  // pre[lo] <= tile < pre[hi]
    while (hi - lo > 1) {
      const int mid = (lo + hi) >> 1;
      (pre[mid] <= tile ? lo : hi) = mid;
    }
    Cursor c;
    c.s = lo;
    c.n_ctx = ctx[lo];
    c.n_tiles = (c.n_ctx + kTile - 1) / kTile;
    const int r = int(tile - pre[lo]);
    c.it = r / c.n_tiles;
    c.j = r % c.n_tiles;
    return c;
  }

  // The next tile in the batch's order (past the last: s == S).
  __device__ __forceinline__ void advance(Cursor& c) const {
    if (++c.j < c.n_tiles) return;
    c.j = 0;
    if (++c.it < items) return;
    c.it = 0;
    do ++c.s;
    while (c.s < S && ctx[c.s] == 0);
    c.n_ctx = c.s < S ? ctx[c.s] : 0;
    c.n_tiles = (c.n_ctx + kTile - 1) / kTile;
  }
};

// The warps' runs: [begin(w), begin(w + 1)) of T tiles.
struct Runs {
  int64_t T, W;
  __device__ __forceinline__ int64_t begin(int64_t w) const { return w * T / W; }
  __device__ __forceinline__ int64_t owner(int64_t tile) const { return ((tile + 1) * W - 1) / T; }
  __device__ __forceinline__ bool empty(int64_t w) const { return begin(w) == begin(w + 1); }
};

// The merger of an item of GL heads: piece k of nw (partial rows rows(k) of
// head 0, heads following; -1: none) into the output rows from out_row on.
// Lane k takes the (max, sum) of piece k of a chunk of 32; the outputs are
// read as float4s, four heads at once.
template <int D, typename Rows>
__device__ __forceinline__ void merge_pieces(const AttnParams& p, int64_t nw, Rows rows, int GL, int64_t out_row,
                                             int lane) {
  constexpr int C4 = D / 4, CH = (C4 + 31) / 32;  // float4 chunks of a row, per lane
  constexpr int HB = 4;                            // heads merged at once
  for (int hb = 0; hb < GL; hb += HB) {
    const int nh = min(HB, GL - hb);
    float M[HB];
#pragma unroll
    for (int h = 0; h < HB; ++h) M[h] = -CUDART_INF_F;
    for (int64_t k0 = 0; k0 < nw; k0 += 32) {
      const int64_t row = k0 + lane < nw ? rows(k0 + lane) : -1;
#pragma unroll
      for (int h = 0; h < HB; ++h)
        if (row >= 0 && h < nh) M[h] = fmaxf(M[h], __ldcg(p.part_ml + (row + hb + h) * 2));
    }
#pragma unroll
    for (int h = 0; h < HB; ++h) M[h] = warp_max(M[h]);
    float L[HB] = {};
    float4 o[HB][CH] = {};
    for (int64_t k0 = 0; k0 < nw; k0 += 32) {
      const int64_t row = k0 + lane < nw ? rows(k0 + lane) : -1;
      float wgt[HB];
#pragma unroll
      for (int h = 0; h < HB; ++h) {
        wgt[h] = 0.0f;
        if (row >= 0 && h < nh) {
          const float* ml = p.part_ml + (row + hb + h) * 2;
          wgt[h] = exp2f(__ldcg(ml) - M[h]);
          L[h] += wgt[h] * __ldcg(ml + 1);
        }
      }
      const int cnt = nw - k0 < 32 ? int(nw - k0) : 32;
#pragma unroll 2
      for (int k = 0; k < cnt; ++k) {
        const int64_t rk = __shfl_sync(0xffffffffu, row, k);
#pragma unroll
        for (int h = 0; h < HB; ++h) {
          const float wk = __shfl_sync(0xffffffffu, wgt[h], k);
          if (h < nh)
#pragma unroll
            for (int ch = 0; ch < CH; ++ch) {
              const int c = lane + 32 * ch;
              if (c < C4) {
                // Rows of empty runs are not read (row 0 in their place; its weight is 0).
                const float4 v = __ldcg(reinterpret_cast<const float4*>(p.part_out + ((rk > 0 ? rk : 0) + hb + h) * D) + c);
                o[h][ch].x += wk != 0.0f ? wk * v.x : 0.0f;
                o[h][ch].y += wk != 0.0f ? wk * v.y : 0.0f;
                o[h][ch].z += wk != 0.0f ? wk * v.z : 0.0f;
                o[h][ch].w += wk != 0.0f ? wk * v.w : 0.0f;
              }
            }
        }
      }
    }
#pragma unroll
    for (int h = 0; h < HB; ++h) {
      const float inv = 1.0f / warp_sum(L[h]);
      if (h < nh)
#pragma unroll
        for (int ch = 0; ch < CH; ++ch) {
          const int c = lane + 32 * ch;
          if (c < C4) {
            __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(p.out + (out_row + hb + h) * D + 4 * c);
            dst[0] = __floats2bfloat162_rn(o[h][ch].x * inv, o[h][ch].y * inv);
            dst[1] = __floats2bfloat162_rn(o[h][ch].z * inv, o[h][ch].w * inv);
          }
        }
    }
  }
}

template <int D, int NH>
__global__ void __launch_bounds__(kThreads, D <= 128 ? 3 : 1) attn_decode_stream_kernel(AttnParams p) {
  using Sm = StreamSmem<D>;
  constexpr int DP = Sm::DP;
  extern __shared__ __align__(16) unsigned char smem[];
  int* pre = reinterpret_cast<int*>(smem + Sm::RING_BYTES);
  int* ctx = pre + kAttnStreamMaxSeqs + 1;
  int* q0s = ctx + kAttnStreamMaxSeqs;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int S = p.num_seqs, G = p.group, hbc = head_blocks(G), items = p.kv_heads * hbc;
  const int SH = min(G, kHeadsPerBlock);  // partial rows per slot

  // Every block scans the batch's contexts (host-written metadata: read while
  // the kernel before us drains). Thread i takes sequences 2i and 2i + 1.
  static_assert(kAttnStreamMaxSeqs == 2 * kThreads, "two sequences per thread");
  {
    int n[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int s = 2 * tid + k;
      n[k] = 0;
      if (s < S) {
        const int q = p.query_start[s];
        const int c = p.query_start[s + 1] - q == 1 ? p.context_len[s] : 0;  // else the prefill kernel serves it
        ctx[s] = c;
        q0s[s] = q;
        n[k] = (c + kTile - 1) / kTile * items;
      }
    }
    int incl = n[0] + n[1];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    if (lane == 31) pre[kAttnStreamMaxSeqs - kWarps + warp] = incl;  // warp totals, in a slot no sequence uses yet
    __syncthreads();
    int base = 0;
    for (int w = 0; w < warp; ++w) base += pre[kAttnStreamMaxSeqs - kWarps + w];
    __syncthreads();
    const int excl = base + incl - n[0] - n[1];
    if (2 * tid < S) pre[2 * tid + 1] = excl + n[0];
    if (2 * tid + 1 < S) pre[2 * tid + 2] = excl + n[0] + n[1];
    if (tid == 0) pre[0] = 0;
    __syncthreads();
  }
  const Scan scan{pre, ctx, q0s, S, items};
  const Runs runs{pre[S], int64_t(gridDim.x) * kWarps};
  const int64_t w = int64_t(blockIdx.x) * kWarps + warp;
  const int64_t begin = runs.begin(w), end = runs.begin(w + 1), n = end - begin;

  // The issue cursor: lane L (and L + 16) finds the pool offset of key L of
  // the next tile to load (-1 past its context or past the run).
  const int64_t slot_stride = int64_t(p.kv_heads) * D;
  const Cursor start = n > 0 ? scan.locate(begin) : Cursor{0, 0, 0, 0, 1};
  Cursor ic = start;
  int64_t issued = 0;
  auto next_offset = [&]() -> int64_t {
    int64_t off = -1;
    const int key = ic.j * kTile + (lane & 15);
    if (issued < n && key < ic.n_ctx) {
      const int64_t blk = p.block_table[int64_t(ic.s) * p.max_blocks_per_seq + key / p.block_size];
      off = (blk * p.block_size + key % p.block_size) * slot_stride + int64_t(ic.it / hbc) * D;
    }
    if (issued < n) scan.advance(ic);
    ++issued;
    return off;
  };
  int64_t first[kStages];
#pragma unroll
  for (int st = 0; st < kStages; ++st) first[st] = next_offset();
  pdl_wait();
  if (n <= 0) return;

  unsigned char* ring_p = smem + warp * kStages * Sm::STAGE_BYTES;
  const WarpRing<D> ring{smem_u32(ring_p)};
  ring.zero_padding(ring_p, lane);
  prime_ring(ring, first, n, lane, p.k_pool, p.v_pool);
  int64_t pending = next_offset();

  // The compute cursor and the piece of its item this warp holds.
  Cursor cc = start;
  int seg_j0 = cc.j;
  uint32_t qa[DP / 16][4];
  auto item_heads = [&](const Cursor& c, int& kvh, int& h0, int& GL) {
    kvh = c.it / hbc;
    h0 = (c.it % hbc) * kHeadsPerBlock;
    GL = min(kHeadsPerBlock, G - h0);
  };
  auto q_of = [&](const Cursor& c) {
    int kvh, h0, GL;
    item_heads(c, kvh, h0, GL);
    load_q<D, NH>(qa, p.q + (int64_t(q0s[c.s]) * p.num_heads + int64_t(kvh) * G + h0) * D, GL, g, t);
  };
  q_of(cc);
  WarpState<D, NH> st;
  st.reset();
  const uint32_t lds_off = ldmatrix_offset<D>(lane);

  for (int64_t i = 0; i < n; ++i) {
    cp_async_wait<kStages - 1>();  // this lane's copies of tile i have landed
    __syncwarp();                 // ... and every lane's
    const int slot = int(i % kStages);
    const uint32_t ks = ring.base + slot * Sm::STAGE_BYTES + lds_off;
    st.step(qa, ks, ks + Sm::TILE_ELEMS * 2, cc.j * kTile, cc.n_ctx, p.scale_log2, t);
    __syncwarp();  // every lane is done with this stage before it is refilled
    if (i + kStages < n) ring.issue(slot, pending, lane, p.k_pool, p.v_pool);
    cp_async_commit();
    pending = next_offset();

    const bool item_end = cc.j + 1 == cc.n_tiles, run_end = i + 1 == n;
    if (!item_end && !run_end) {
      scan.advance(cc);
      continue;
    }
    // The piece of item pc ends (tiles seg_j0 .. pc.j). The next item's
    // queries load first, so that their latency overlaps the write-out.
    const Cursor pc = cc;
    if (!run_end) {
      scan.advance(cc);
      q_of(cc);
    }
    int kvh, h0, GL;
    item_heads(pc, kvh, h0, GL);
    st.reduce_l();
    const int64_t out_row = int64_t(q0s[pc.s]) * p.num_heads + int64_t(kvh) * G + h0;  // head h0's row
    if (seg_j0 == 0 && item_end) {  // the whole item: normalize and write
      st.for_each_output(
          g, t, [&](int r, int c) { return 1.0f / __shfl_sync(0xffffffffu, st.l[r], 8 * t + 4 * c); },
          [&](int h, int d, float v) {
            if (h < GL) p.out[(out_row + h) * D + d] = __float2bfloat16(v);
          });
    } else {
      // A piece of a cut item. It is this run's first piece if the item
      // started before the run (publish it), else its last (merge after it).
      const int64_t a = scan.pre[pc.s] + int64_t(pc.it) * pc.n_tiles;
      const bool merger = a >= begin;
      const int64_t slot_row = (w * 2 + (merger ? 1 : 0)) * SH;
#pragma unroll
      for (int r = 0; r < NH; ++r)
        if (t == 0 && g + 8 * r < GL) {
          p.part_ml[(slot_row + g + 8 * r) * 2] = st.m[r];
          p.part_ml[(slot_row + g + 8 * r) * 2 + 1] = st.l[r];
        }
      st.for_each_output(
          g, t, [](int, int) { return 1.0f; },
          [&](int h, int d, float v) {
            if (h < GL) p.part_out[(slot_row + h) * D + d] = v;
          });
      if (!merger) {
        __threadfence();
        __syncwarp();
        if (lane == 0) st_release(p.piece_ready + w, 1);
      } else {
        // Pieces: ours, then the first piece of each later warp whose run
        // meets the item (warps with empty runs have none).
        __syncwarp();
        const int64_t nw = runs.owner(a + pc.n_tiles - 1) - w + 1;
        if (lane == 0)
          for (int64_t k = 1; k < nw; ++k)
            if (!runs.empty(w + k))
              while (ld_acquire(p.piece_ready + w + k) == 0) {
              }
        __syncwarp();
        merge_pieces<D>(p, nw, [&](int64_t k) -> int64_t {
          return k == 0 ? slot_row : runs.empty(w + k) ? -1 : (w + k) * 2 * SH;
        }, GL, out_row, lane);
        __syncwarp();
        if (lane == 0)
          for (int64_t k = 1; k < nw; ++k) p.piece_ready[w + k] = 0;  // ready for the next launch
      }
    }
    if (!run_end) {  // the next item starts at its first tile
      seg_j0 = 0;
      st.reset();
    }
  }
}

// Blocks of one instantiation that an SM holds at once (set up once per
// device, so that calls under stream capture touch nothing but the launch).
template <int D, int NH>
int stream_resident_blocks() {
  static PerDevice<int> per_sm;
  int dev = 0;
  SERVAL_CUDA_CHECK(cudaGetDevice(&dev));
  return per_sm.get(dev, [] {
    constexpr int smem = StreamSmem<D>::BYTES;
    auto* kernel = attn_decode_stream_kernel<D, NH>;
    if (smem > 48 * 1024)
      SERVAL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    SERVAL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                           int(cudaSharedmemCarveoutMaxShared)));
    int n = 0;
    SERVAL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, smem));
    return std::max(n, 1);
  });
}

// Calls f(kernel, resident blocks per SM, shared bytes) for p's instantiation.
template <typename F>
bool with_stream_kernel(const AttnParams& p, F&& f) {
  return with_head_dim(p.head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    if (two_head_tiles(p.group))
      f(attn_decode_stream_kernel<D, 2>, stream_resident_blocks<D, 2>(), StreamSmem<D>::BYTES);
    else
      f(attn_decode_stream_kernel<D, 1>, stream_resident_blocks<D, 1>(), StreamSmem<D>::BYTES);
  });
}

// (sequence, KV head, head block) items of a launch.
int64_t stream_items(const AttnParams& p) { return int64_t(p.num_seqs) * p.kv_heads * head_blocks(p.group); }

}  // namespace

int attention_decode_stream_blocks(const AttnParams& p, int num_sms) {
  if (p.num_seqs < 1 || p.num_seqs > kAttnStreamMaxSeqs) return 0;
  int per_sm = 0;
  with_stream_kernel(p, [&](auto, int blocks, int) { per_sm = blocks; });
  return per_sm * std::max(num_sms, 1);
}

// Long contexts (a mean of kLongDecodeContext tokens or more) whose items
// alone fill the GPU's resident blocks (as the split planner's one-split rule
// has it). On the H200 the stream kernel reads K/V at 3.9-4.3 TB/s against the
// split kernel's 3.7-3.8 with 64 sequences of 4k-32k tokens (Llama-3.1-8B
// shape), but is 7-15% slower at 128-256 tokens, where each warp's run
// crosses several items. Groups beyond 8 heads (two head tiles) stay with the
// split kernel: the stream kernel spills there.
bool attention_decode_stream_preferred(const AttnParams& p, int num_sms, int mean_context) {
  if (mean_context < kLongDecodeContext || two_head_tiles(p.group)) return false;
  const int blocks = attention_decode_stream_blocks(p, num_sms);
  return blocks > 0 && stream_items(p) * 5 >= int64_t(blocks) * 4;
}

int64_t attention_decode_stream_partial_floats(const AttnParams& p) {
  const int64_t rows = int64_t(p.stream_blocks) * kWarps * 2 * std::min(p.group, kHeadsPerBlock);
  return rows * (p.head_dim + 2);
}

int64_t attention_decode_stream_warps(const AttnParams& p) { return int64_t(p.stream_blocks) * kWarps; }

bool launch_attention_decode_stream(const AttnParams& p, const Launch& on) {
  SERVAL_CHECK(p.stream_blocks > 0 && p.num_seqs <= kAttnStreamMaxSeqs && p.piece_ready != nullptr,
               "decode attention (stream): bad launch");
  SERVAL_CHECK(p.window == 0, "decode attention (stream): no sliding window (plan_attention takes the split kernel)");
  return with_stream_kernel(p, [&](auto kernel, int, int smem) {
    launch_pdl(kernel, dim3(unsigned(p.stream_blocks)), dim3(kThreads), size_t(smem), on, p);
  });
}

}  // namespace serval::cuda
