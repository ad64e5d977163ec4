// Split-free decode attention in persistent blocks (SERVAL_ATTN_PERSISTENT=1,
// an experiment): the launches the split kernel runs with one split, as
// resident blocks that each take items (sequence, KV head, head block) b,
// b + grid, b + 2 grid, ...
//
// Why: with one split, the split kernel's blocks all do the same work, so its
// waves of blocks stay in step. Every wave starts with a round of metadata
// loads and the first K/V copies, during which the SM streams nothing, and
// ends with the warps' combine. On the H200 a 64-sequence launch pays ~11.6 us
// that does not depend on the context (docs/BENCHMARKS.md, session 34), about
// 1 us per wave. Here each warp streams its tiles through its ring without
// stopping at items: while it computes an item's last tiles, the ring already
// holds the next item's first ones, and the combine has its own shared memory
// so that they fly through it.
//
// Each item is computed as the split kernel computes it with one split (warp
// w takes tiles w, w + 4, ...; the same step; the warps combined in the same
// order), so the output has the same bits.
#include <math_constants.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "backend/cuda/cuda_attention.cuh"
#include "backend/cuda/cuda_attention_decode_tile.cuh"
#include "backend/cuda/cuda_ptx.cuh"
#include "backend/cuda/cuda_stats.h"

namespace serval::cuda {

namespace {

using namespace decode;
using namespace ptx;

// Shared memory: the warps' rings, then the combine rows (per warp, GL heads
// of CS floats), then (m, l) per warp and head and the block's (M, L).
template <int D>
struct PersistentSmem : DecodeSmem<D> {
  static constexpr int CS = DecodeSmem<D>::DP + 4;  // f32 stride of the combine rows
  static constexpr int ML_FLOATS = (kWarps + 1) * kHeadsPerBlock * 2;
  static constexpr int bytes(int gl) { return DecodeSmem<D>::RING_BYTES + (ML_FLOATS + kWarps * gl * CS) * 4; }
};

// One item's metadata (host-written: readable before pdl_wait).
struct Item {
  int s = 0, kvh = 0, h0 = 0, q0 = 0, n_ctx = 0;  // n_ctx 0: no item, or not a decode row
  const int32_t* table = nullptr;
};

template <int D, int NH>
__global__ void __launch_bounds__(kThreads, D <= 128 ? 3 : 1) attn_decode_persistent_kernel(AttnParams p) {
  using Sm = PersistentSmem<D>;
  constexpr int DP = Sm::DP, MT = DP / 16;
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int G = p.group, hb_count = head_blocks(G), per_seq = p.kv_heads * hb_count;
  const int items = p.num_seqs * per_seq, GLmax = min(kHeadsPerBlock, G);

  auto item_at = [&](int k) {
    Item it;
    if (k >= items) return it;
    it.s = k / per_seq;
    const int r = k % per_seq;
    it.kvh = r / hb_count;
    it.h0 = (r % hb_count) * kHeadsPerBlock;
    it.q0 = p.query_start[it.s];
    const bool decode = p.query_start[it.s + 1] - it.q0 == 1;  // else the prefill kernel serves it
    it.n_ctx = decode ? p.context_len[it.s] : 0;
    it.table = p.block_table + int64_t(it.s) * p.max_blocks_per_seq;
    return it;
  };
  auto warp_tiles = [&](int n_ctx) { return max(0, ((n_ctx + kTile - 1) / kTile - warp + kWarps - 1) / kWarps); };

  // The items computed (cur) and the one after it (nxt); the issue cursor is at
  // tile ii of one of them, at most a ring ahead of the computed tile.
  int k = blockIdx.x;
  Item cur = item_at(k), nxt = item_at(k + int(gridDim.x));
  bool on_next = false;
  int ii = 0;
  // The cursor's item's fields (selected one by one: a reference to either
  // item would put both in local memory).
  auto cursor_ctx = [&] { return on_next ? nxt.n_ctx : cur.n_ctx; };
  auto normalize = [&] {  // past cur's last tile: to nxt's first
    if (!on_next && ii >= warp_tiles(cur.n_ctx)) {
      on_next = true;
      ii = 0;
      return true;
    }
    return false;
  };
  const int64_t slot_stride = int64_t(p.kv_heads) * D;
  // Lane L (and L + 16): the pool offset of key L of the cursor's tile (-1 past the context).
  auto cursor_offset = [&]() -> int64_t {
    const int n_ctx = cursor_ctx();
    const int j = (warp + ii * kWarps) * kTile + (lane & 15);
    if (ii >= warp_tiles(n_ctx) || j >= n_ctx) return -1;
    const int32_t* table = on_next ? nxt.table : cur.table;
    const int64_t blk = table[j / p.block_size];
    return (blk * p.block_size + j % p.block_size) * slot_stride + int64_t(on_next ? nxt.kvh : cur.kvh) * D;
  };
  normalize();
  int64_t pending = cursor_offset();

  unsigned char* ring_p = smem + warp * kStages * Sm::STAGE_BYTES;
  const WarpRing<D> ring{smem_u32(ring_p)};
  ring.zero_padding(ring_p, lane);
  float* ml_s = reinterpret_cast<float*>(smem + Sm::RING_BYTES);  // [warp][head] (m, l)
  float* fin_s = ml_s + kWarps * kHeadsPerBlock * 2;               // [head] (M, L)
  float* comb = ml_s + Sm::ML_FLOATS;                              // [warp][GLmax][CS]

  pdl_wait();  // q and the K/V pools are written by the kernels before us

  // Tiles issued and computed, groups committed, and the group of the tile in
  // each ring slot: a tile whose group is the newest waits for all.
  int issued = 0, computed = 0, committed = 0, group0 = 0, group1 = 0;
  auto issue_next = [&] {
    if (ii < warp_tiles(cursor_ctx())) {  // else the cursor waits at nxt's end
      const int slot = issued & 1;
      ring.issue(slot, pending, lane, p.k_pool, p.v_pool);
      (slot == 0 ? group0 : group1) = committed;
      ++issued;
      ++ii;
      normalize();
      pending = cursor_offset();
    }
    cp_async_commit();
    ++committed;
  };
  static_assert(kStages == 2, "two ring slots");

  WarpState<D, NH> st;
  const uint32_t lds_off = ldmatrix_offset<D>(lane);
  uint32_t qa[DP / 16][4];
  while (k < items) {
    // This item's first tiles (unless the item before issued them already).
    while (issued - computed < kStages && ii < warp_tiles(cursor_ctx())) issue_next();
    if (cur.n_ctx > 0) {
      const int GL = min(kHeadsPerBlock, G - cur.h0);
      load_q<D, NH>(qa, p.q + (int64_t(cur.q0) * p.num_heads + int64_t(cur.kvh) * G + cur.h0) * D, GL, g, t);
      st.reset();
      const int nt = warp_tiles(cur.n_ctx);
      for (int i = 0; i < nt; ++i) {
        const int slot = computed & 1;
        if ((slot == 0 ? group0 : group1) == committed - 1)
          cp_async_wait<0>();
        else
          cp_async_wait<1>();
        __syncwarp();
        const uint32_t ks = ring.base + slot * Sm::STAGE_BYTES + lds_off;
        st.step(qa, ks, ks + Sm::TILE_ELEMS * 2, (warp + i * kWarps) * kTile, cur.n_ctx, p.scale_log2, t);
        __syncwarp();  // every lane is done with this slot before it is refilled
        ++computed;
        issue_next();
      }

      // The warps combined as the split kernel combines them (same order).
      st.reduce_l();
#pragma unroll
      for (int r = 0; r < NH; ++r)
        if (t == 0) {
          ml_s[(warp * kHeadsPerBlock + g + 8 * r) * 2] = st.m[r];
          ml_s[(warp * kHeadsPerBlock + g + 8 * r) * 2 + 1] = st.l[r];
        }
      __syncthreads();
      auto warp_weight = [&](int w, int h, float M) {
        const float mw = ml_s[(w * kHeadsPerBlock + h) * 2];
        return mw == -CUDART_INF_F ? 0.0f : exp2f(mw - M);
      };
      auto block_max = [&](int h) {
        float M = -CUDART_INF_F;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) M = fmaxf(M, ml_s[(w * kHeadsPerBlock + h) * 2]);
        return M;
      };
#pragma unroll
      for (int r = 0; r < NH; ++r)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int h = 8 * r + 2 * t + c;
          const float w = warp_weight(warp, h, block_max(h));
          if (h < GL) {
            float* row = comb + (warp * GLmax + h) * Sm::CS + g;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              row[16 * mt] = st.acc[r][mt][c] * w;
              row[16 * mt + 8] = st.acc[r][mt][2 + c] * w;
            }
          }
        }
      if (tid < GL) {
        const float M = block_max(tid);
        float L = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) L += ml_s[(w * kHeadsPerBlock + tid) * 2 + 1] * warp_weight(w, tid, M);
        fin_s[tid * 2] = M;
        fin_s[tid * 2 + 1] = L;
      }
      __syncthreads();
      bf16* orow = p.out + (int64_t(cur.q0) * p.num_heads + int64_t(cur.kvh) * G + cur.h0) * D;
      for (int e = tid; e < GL * (D / 2); e += kThreads) {
        const int h = e / (D / 2), d = 2 * (e % (D / 2));
        float2 o = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
          const float2 v = *reinterpret_cast<const float2*>(comb + (w * GLmax + h) * Sm::CS + d);
          o.x += v.x;
          o.y += v.y;
        }
        const float inv = 1.0f / fin_s[h * 2 + 1];
        *reinterpret_cast<__nv_bfloat162*>(orow + h * D + d) = __floats2bfloat162_rn(o.x * inv, o.y * inv);
      }
      // The next item's (m, l) and combine rows are written only after its
      // first barrier, which every thread reaches after these reads.
    }
    // On to the next item: the cursor, on nxt (or waiting at its end), now on cur.
    k += int(gridDim.x);
    cur = nxt;
    nxt = item_at(k + int(gridDim.x));
    on_next = false;
    if (normalize()) pending = cursor_offset();
  }
  cp_async_wait<0>();
}

template <int D, int NH>
int persistent_blocks_per_sm(int smem) {
  static int set_for = 0;
  if (set_for == 0) {  // the limit once, for the largest form
    SERVAL_CUDA_CHECK(cudaFuncSetAttribute(attn_decode_persistent_kernel<D, NH>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           PersistentSmem<D>::bytes(kHeadsPerBlock)));
    SERVAL_CUDA_CHECK(cudaFuncSetAttribute(attn_decode_persistent_kernel<D, NH>,
                                           cudaFuncAttributePreferredSharedMemoryCarveout,
                                           int(cudaSharedmemCarveoutMaxShared)));
    set_for = 1;
  }
  int n = 0;
  SERVAL_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attn_decode_persistent_kernel<D, NH>, kThreads, smem));
  return std::max(n, 1);
}

}  // namespace

namespace {
std::atomic<int> persistent_mode{-1};  // -1: not read yet
std::atomic<int64_t> persistent_launches{0};
}  // namespace

bool attention_decode_persistent_enabled() {
  int m = persistent_mode.load(std::memory_order_relaxed);
  if (m < 0) {
    const char* v = std::getenv("SERVAL_ATTN_PERSISTENT");
    m = v != nullptr && v[0] == '1';
    persistent_mode.store(m, std::memory_order_relaxed);
  }
  return m == 1;
}

void set_attention_decode_persistent(bool on) { persistent_mode.store(on ? 1 : 0, std::memory_order_relaxed); }

int64_t persistent_attention_launches() { return persistent_launches.load(std::memory_order_relaxed); }

bool attention_decode_persistent_fits(const AttnParams& p) {
  return p.num_splits == 1 && p.fold.inv_freq == nullptr && !two_head_tiles(p.group) && p.num_seqs > 0;
}

bool launch_attention_decode_persistent(const AttnParams& p, cudaStream_t stream) {
  SERVAL_CHECK(attention_decode_persistent_fits(p), "persistent decode attention: one split, no rope fold, up to 8 heads a group");
  return with_head_dim(p.head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    const int smem = PersistentSmem<D>::bytes(std::min(kHeadsPerBlock, p.group));
    int dev = 0, sms = 0;
    SERVAL_CUDA_CHECK(cudaGetDevice(&dev));
    SERVAL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const int64_t items = int64_t(p.num_seqs) * p.kv_heads * head_blocks(p.group);
    const int blocks = int(std::min<int64_t>(items, int64_t(persistent_blocks_per_sm<D, 1>(smem)) * sms));
    persistent_launches.fetch_add(1, std::memory_order_relaxed);
    launch_pdl(attn_decode_persistent_kernel<D, 1>, dim3(unsigned(blocks)), dim3(kThreads), size_t(smem), stream, p);
  });
}

}  // namespace serval::cuda
