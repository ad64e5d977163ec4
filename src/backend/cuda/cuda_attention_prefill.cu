// FlashAttention-2-style attention for sequences with several new tokens
// (prefill chunks) on tensor cores, for head_dim 64 and 128; other head dims
// go to the CUDA-core kernel of cuda_attention_prefill_simt.cu.
//
// A thread block takes 128 query rows of one KV head: 128 / G tokens x the G
// query heads of its GQA group (row r = token r / G, head r % G), so each K/V
// tile is loaded once for the whole group. Four warps own 32 rows each (two
// m16 tiles: every K/V fragment read from shared memory feeds two mma's).
// Per key tile of 64: S = Q K^T (mma.sync m16n8k16, bf16 in, f32 out), the
// causal mask by position (only on tiles that reach past a warp's first
// row), f32 online softmax with exp2, P rounded to bf16 straight from the S
// accumulators into A fragments, O += P V. K/V tiles are gathered through
// the block table with cp.async into a double buffer, so the next tile loads
// while this one is computed; keys run from 0, so a chunk sees the cached
// prefix and itself. Shared-memory rows are XOR-swizzled in 16-byte chunks
// so that ldmatrix and cp.async are free of bank conflicts. With a sliding
// window (kWindow) keys start at the tile holding the block's first row's
// first key, keys below each row's window are masked like the causal ones,
// a warp skips tiles below every one of its rows' windows, and keys below
// the block's first key are never looked up (their blocks may be released).
#include <math_constants.h>

#include <algorithm>
#include <climits>
#include <type_traits>

#include "backend/cuda/cuda_attention.cuh"
#include "backend/cuda/cuda_ptx.cuh"
#include "backend/cuda/cuda_attention_prefill_simt.cuh"

namespace serval::cuda {

namespace {

using namespace ptx;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpRows = 32;              // two m16 tiles per warp
constexpr int kRows = kWarps * kWarpRows;  // query rows per block
constexpr int kKeys = 64;                  // keys per K/V tile

// Q [kRows][D], then two stages of K [kKeys][D] and V [kKeys][D], all bf16,
// then the position of each query row (int32, -1 for padding rows).
template <int D>
constexpr int tc_smem_bytes() {
  return (kRows + 4 * kKeys) * D * 2 + kRows * 4;
}

// Byte offset of 16-byte chunk `ch` of row `row` in a tile of rows of D bf16:
// the chunk index is XORed with row % 8, so the 8 rows an ldmatrix matrix (or
// 8 lanes of a cp.async) touch fall in 8 different bank groups.
template <int D>
__device__ __forceinline__ uint32_t swz(int row, int ch) {
  return uint32_t(row * (D * 2) + ((ch ^ (row & 7)) << 4));
}

// One block's work item: query tile `tile` of sequence s (a prefill
// sequence with a row in that tile), KV head kvh.
template <int D, bool kFastTable, bool kWindow>
__device__ __forceinline__ void attend_tile(const AttnParams& p, int s, int tile, int kvh, unsigned char* smem) {
  constexpr int RB = D * 2;         // bytes per row
  constexpr int NCH = D / 8;        // 16-byte chunks per row
  constexpr int NT = kKeys / 8;     // 8-key n-tiles of S
  constexpr int DT = D / 8;         // 8-wide d-tiles of O
  constexpr int KV_BYTES = kKeys * RB;
  const uint32_t s_q = smem_u32(smem);
  const uint32_t s_kv = s_q + kRows * RB;  // stage b: K at s_kv + 2b KV_BYTES, V after it
  __syncthreads();  // the block's previous work item is done with shared memory

  const int qs = p.query_start[s], qe = p.query_start[s + 1];
  const int G = p.group, QT = kRows / G;
  const int t0 = qs + tile * QT;  // < qe: the caller checked
  const int n_tok = min(QT, qe - t0);
  const int n_rows = n_tok * G;  // rows n_rows.. are padding
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t tok_stride = int64_t(p.num_heads) * D;
  const int32_t* pos = p.positions + t0;

  // ---- Q tile: token i's G heads are contiguous (G * D values) ----
  {
    const bf16* q0 = p.q + int64_t(t0) * tok_stride + int64_t(kvh) * G * D;
#pragma unroll 4
    for (int c = tid; c < kRows * NCH; c += kThreads) {
      const int r = c / NCH, ch = c % NCH, i = r / G;
      const bool live = r < n_rows;
      const bf16* src = live ? q0 + i * tok_stride + (r - i * G) * D + ch * 8 : p.q;
      cp_async_16(s_q + swz<D>(r, ch), src, live);
    }
  }

  // ---- key range: the block's last position; per warp, its rows' first and last ----
  int last = -1;
  for (int k = lane; k < n_tok; k += 32) last = max(last, pos[k]);
  const int n_keys = __reduce_max_sync(0xffffffffu, last) + 1;
  const int n_tiles = (n_keys + kKeys - 1) / kKeys;
  // The block's first key (positions increase within a chunk: its first
  // row's window starts lowest) and its tile.
  const int key_lo = kWindow ? max(0, pos[0] + 1 - p.window) : 0;
  const int kt_lo = kWindow ? key_lo / kKeys : 0;
  // Row positions live in shared memory (read on masked tiles only: registers
  // are short); lane owns row warp * 32 + lane for the warp's first and last.
  int* s_pos = reinterpret_cast<int*>(smem + (kRows + 4 * kKeys) * RB);
  int w_first = INT_MAX, w_last = -1;
  {
    const int r = warp * kWarpRows + lane;
    const int rp = r < n_rows ? pos[r / G] : -1;
    s_pos[r] = rp;  // visible after the first barrier of the tile loop
    if (r < n_rows) w_first = w_last = rp;
  }
  w_first = __reduce_min_sync(0xffffffffu, w_first);
  w_last = __reduce_max_sync(0xffffffffu, w_last);

  // ---- K/V tile loader. Thread owns chunk tid % NCH of the LD_N consecutive
  // keys from (tid / NCH) * LD_N. With power-of-two blocks of >= 8 keys
  // (kFastTable) they share one block-table entry, fetched a tile ahead (its
  // latency would otherwise stall the copies it addresses); other block sizes
  // look each key up when its tile is loaded. ----
  constexpr int LD_N = kKeys * NCH / kThreads;
  static_assert(LD_N <= 8 && kThreads % NCH == 0, "a thread's keys must lie in one block of >= 8");
  const int32_t* table = p.block_table + int64_t(s) * p.max_blocks_per_seq;
  const int bs = p.block_size, bs_shift = __ffs(bs) - 1, bs_mask = bs - 1;
  const int ld_ch = tid % NCH, ld_key = (tid / NCH) * LD_N;
  const uint32_t kv_row_chunks = uint32_t(p.kv_heads) * NCH;  // from one slot to the next
  const Bf16x8* k_pool = reinterpret_cast<const Bf16x8*>(p.k_pool);
  const Bf16x8* v_pool = reinterpret_cast<const Bf16x8*>(p.v_pool);
  auto table_entry = [&](int kt) {
    const int j = kt * kKeys + ld_key;
    // (LD_N keys in one block: it holds a key from key_lo on, so it is live.)
    return kFastTable && j < n_keys && (!kWindow || j + LD_N > key_lo) ? table[j >> bs_shift] : 0;
  };
  // Pool rows (slot, KV head) in 32 bits (2^32 rows is far beyond any pool), widened once.
  auto load_kv = [&](int kt, int stage, int block) {
    const uint32_t s_k = s_kv + 2 * stage * KV_BYTES, s_v = s_k + KV_BYTES;
    const int j0 = kt * kKeys + ld_key;
    const uint64_t chunk0 = uint64_t((uint32_t(block) * bs + (j0 & bs_mask)) * p.kv_heads + kvh) * NCH + ld_ch;
#pragma unroll
    for (int u = 0; u < LD_N; ++u) {
      const int j = j0 + u;
      const bool live = kWindow ? j < n_keys && j >= key_lo : j < n_keys;
      uint64_t chunk;
      if constexpr (kFastTable) {
        chunk = chunk0 + u * kv_row_chunks;
      } else {
        const uint32_t row = live ? (uint32_t(table[j / bs]) * bs + j % bs) * p.kv_heads + kvh : 0;
        chunk = uint64_t(row) * NCH + ld_ch;
      }
      const uint32_t dst = swz<D>(ld_key + u, ld_ch);
      cp_async_16(s_k + dst, live ? k_pool + chunk : k_pool, live);
      cp_async_16(s_v + dst, live ? v_pool + chunk : v_pool, live);
    }
  };
  load_kv(kt_lo, kt_lo & 1, table_entry(kt_lo));
  cp_async_commit();
  int next_block = table_entry(kt_lo + 1);  // for the tile loaded next

  // Per-lane ldmatrix offsets; the 16-byte chunk of k-step ks (16 columns)
  // is reached by XOR with ks * 32 (see swz: row % 8 == lane % 8 throughout).
  const int l7 = lane & 7;
  uint32_t q_off[2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
    q_off[mt] = uint32_t((warp * kWarpRows + mt * 16 + (lane & 15)) * RB) | uint32_t(((lane >> 4) ^ l7) << 4);
  const uint32_t k_off = uint32_t((((lane >> 4) << 3) + l7) * RB) | uint32_t((((lane >> 3) & 1) ^ l7) << 4);
  const uint32_t v_off = uint32_t(((((lane >> 3) & 1) << 3) + l7) * RB) | uint32_t(((lane >> 4) ^ l7) << 4);

  const float scale = p.scale_log2;  // > 0: the running max is kept unscaled
  float o[2][DT][4];
  float m[2][2], l[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.0f;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      m[mt][hf] = -CUDART_INF_F;
      l[mt][hf] = 0.0f;
    }
  }

  for (int kt = kt_lo; kt < n_tiles; ++kt) {
    // Tile kt has landed for every thread, and every warp is done with the
    // stage the next load overwrites (it held tile kt - 1).
    cp_async_wait_all();
    __syncthreads();
    if (kt + 1 < n_tiles) {
      load_kv(kt + 1, (kt + 1) & 1, next_block);
      next_block = table_entry(kt + 2);
    }
    cp_async_commit();
    const int key0 = kt * kKeys;
    if (key0 > w_last) continue;  // warp-uniform: none of this warp's rows sees these keys
    if (kWindow && key0 + kKeys <= w_first + 1 - p.window) continue;  // ... nor these: below every window
    const uint32_t s_k = s_kv + 2 * (kt & 1) * KV_BYTES, s_v = s_k + KV_BYTES;

    // ---- S = Q K^T ----
    float sc[2][NT][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[mt][nt][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      uint32_t a[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) ldmatrix_x4(a[mt], s_q + (q_off[mt] ^ uint32_t(ks * 32)));
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t b[4];  // b0, b1 of keys 16 np.. and of keys 16 np + 8..
        ldmatrix_x4(b, s_k + np * 16 * RB + (k_off ^ uint32_t(ks * 32)));
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma_bf16_16816(sc[mt][2 * np], a[mt], b[0], b[1]);
          mma_bf16_16816(sc[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }

    // ---- causal mask: only where this tile reaches past the warp's first row
    // (or, with a window, starts below the warp's last row's first key) ----
    if (key0 + kKeys - 1 > w_first || (kWindow && key0 < w_last + 1 - p.window)) {
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          // keys past the row's position, relative to this lane's first key column
          const int lim = s_pos[warp * kWarpRows + mt * 16 + hf * 8 + (lane >> 2)] - key0 - (lane & 3) * 2;
          const int lo = kWindow ? lim + 1 - p.window : 0;  // and keys before the row's window
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              if (nt * 8 + e > lim || (kWindow && nt * 8 + e < lo)) sc[mt][nt][2 * hf + e] = -CUDART_INF_F;
        }
    }

    // ---- online softmax (rows are shared by the 4 lanes of a quad) ----
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float mx = m[mt][hf];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(sc[mt][nt][2 * hf], sc[mt][nt][2 * hf + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_scaled = mx == -CUDART_INF_F ? 0.0f : mx * scale;  // a row with no live key yet
        const float alpha = exp2_approx(m[mt][hf] * scale - m_scaled);
        m[mt][hf] = mx;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 2 * hf; e < 2 * hf + 2; ++e) {
            const float pe = exp2_approx(fmaf(sc[mt][nt][e], scale, -m_scaled));
            sc[mt][nt][e] = pe;
            sum += pe;
          }
        l[mt][hf] = l[mt][hf] * alpha + sum;  // per-lane partial; the quad sums at the end
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          o[mt][dt][2 * hf] *= alpha;
          o[mt][dt][2 * hf + 1] *= alpha;
        }
      }

    // ---- O += P V: the accumulators of n-tiles 2kk, 2kk+1 are the A fragment of k-step kk ----
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      uint32_t pa[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        pa[mt][0] = pack_bf16x2(sc[mt][2 * kk][0], sc[mt][2 * kk][1]);
        pa[mt][1] = pack_bf16x2(sc[mt][2 * kk][2], sc[mt][2 * kk][3]);
        pa[mt][2] = pack_bf16x2(sc[mt][2 * kk + 1][0], sc[mt][2 * kk + 1][1]);
        pa[mt][3] = pack_bf16x2(sc[mt][2 * kk + 1][2], sc[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b[4];  // b0, b1 of d-tile 2 dp, then of d-tile 2 dp + 1
        ldmatrix_x4_trans(b, s_v + kk * 16 * RB + (v_off ^ uint32_t(dp * 32)));
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma_bf16_16816(o[mt][2 * dp], pa[mt], b[0], b[1]);
          mma_bf16_16816(o[mt][2 * dp + 1], pa[mt], b[2], b[3]);
        }
      }
    }
  }

  // ---- epilogue: O / l as bf16 into this warp's own Q rows (no other warp
  // reads them), then 16-byte coalesced stores to out ----
  __syncwarp();
  asm volatile("" ::: "memory");
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float sum = l[mt][hf];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // 0: padding rows, never stored
      const int r = warp * kWarpRows + mt * 16 + hf * 8 + (lane >> 2);
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        const uint32_t v = pack_bf16x2(o[mt][dt][2 * hf] * inv, o[mt][dt][2 * hf + 1] * inv);
        *reinterpret_cast<uint32_t*>(smem + swz<D>(r, dt) + (lane & 3) * 4) = v;
      }
    }
  __syncwarp();
  bf16* out0 = p.out + int64_t(t0) * tok_stride + int64_t(kvh) * G * D;
#pragma unroll 4
  for (int c = lane; c < kWarpRows * NCH; c += 32) {
    const int r = warp * kWarpRows + c / NCH, ch = c % NCH;
    if (r < n_rows) {
      const int i = r / G;
      *reinterpret_cast<Bf16x8*>(out0 + i * tok_stride + (r - i * G) * D + ch * 8) =
          *reinterpret_cast<const Bf16x8*>(smem + swz<D>(r, ch));
    }
  }
}

// Grid: (KV head, query tile counted from the last, z). Block z serves the
// prefill sequences (query_len >= min_query_len) of rank z, z + Z, ... (Z = gridDim.z),
// found by a warp-wide scan of query_start: decode sequences and tiles past a
// sequence's end cost no block, and Z is sized by the launcher so the grid
// stays a few waves even for a batch of hundreds of decode rows.
template <int D, bool kFastTable, bool kWindow>
__global__ void __launch_bounds__(kThreads, D == 64 ? 3 : 2) attn_prefill_tc_kernel(AttnParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int kvh = blockIdx.x, z = blockIdx.z, Z = gridDim.z;
  const int tile = int(gridDim.y) - 1 - int(blockIdx.y);  // longest (last) tiles start first
  const int lane = threadIdx.x & 31, first_row = tile * (kRows / p.group);
  int rank0 = 0;  // prefill sequences before s0
  for (int s0 = 0; s0 < p.num_seqs; s0 += 32) {  // every warp scans alike: control stays block-uniform
    const int s = s0 + lane;
    const int ql = s < p.num_seqs ? p.query_start[s + 1] - p.query_start[s] : 0;
    const bool ours = ql >= p.min_query_len;  // min_query_len >= 1: past num_seqs (ql 0) never
    const unsigned prefill = __ballot_sync(0xffffffffu, ours);
    const int rank = rank0 + __popc(prefill & ((1u << lane) - 1));
    unsigned mine = __ballot_sync(0xffffffffu, ours && rank % Z == z && first_row < ql);
    rank0 += __popc(prefill);
    while (mine) {
      const int i = __ffs(mine) - 1;
      mine &= mine - 1;
      attend_tile<D, kFastTable, kWindow>(p, s0 + i, tile, kvh, smem);
    }
  }
}

template <int D, bool kFastTable, bool kWindow>
void launch_tc(const AttnParams& p, int max_query_len, cudaStream_t stream) {
  constexpr int smem = tc_smem_bytes<D>();
  // Per-kernel attributes, set once on each device.
  static PerDevice<bool> configured;
  int dev = 0;
  SERVAL_CUDA_CHECK(cudaGetDevice(&dev));
  configured.get(dev, [] {
    const auto kernel = attn_prefill_tc_kernel<D, kFastTable, kWindow>;
    SERVAL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    SERVAL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                           int(cudaSharedmemCarveoutMaxShared)));
    return true;
  });
  // z: enough sequence slots for ~1024 blocks (a few waves of 2-3 blocks per
  // SM), never more than there are sequences.
  const int qt = kRows / p.group, tiles = (max_query_len + qt - 1) / qt;
  SERVAL_CHECK(tiles <= 65535, "cuda attention: ", max_query_len, " new tokens of one sequence is too many");
  const int64_t per_z = int64_t(p.kv_heads) * tiles;
  const int z = int(std::clamp<int64_t>((1024 + per_z - 1) / per_z, 1, std::min(p.num_seqs, 1024)));
  const dim3 grid(unsigned(p.kv_heads), unsigned(tiles), unsigned(z));
  attn_prefill_tc_kernel<D, kFastTable, kWindow><<<grid, kThreads, smem, stream>>>(p);
  SERVAL_CUDA_LAUNCH_CHECK();
}

}  // namespace

bool launch_attention_prefill(const AttnParams& p, int max_query_len, cudaStream_t stream) {
  if (p.head_dim != 64 && p.head_dim != 128) return launch_attention_prefill_simt(p, max_query_len, stream);
  SERVAL_CHECK(p.group >= 1 && p.group <= kRows, "cuda attention: GQA group of ", p.group,
               " query heads per KV head is more than the prefill kernel's ", kRows, " rows");
  SERVAL_CHECK(p.block_size >= 1, "cuda attention: block size ", p.block_size);
  if (max_query_len < p.min_query_len || p.num_seqs <= 0) return true;
  const bool fast = p.block_size >= 8 && (p.block_size & (p.block_size - 1)) == 0;
  auto launch = [&](auto d, auto w) {
    constexpr int D = decltype(d)::value;
    constexpr bool W = decltype(w)::value;
    fast ? launch_tc<D, true, W>(p, max_query_len, stream) : launch_tc<D, false, W>(p, max_query_len, stream);
  };
  using D64 = std::integral_constant<int, 64>;
  using D128 = std::integral_constant<int, 128>;
  if (p.window > 0)
    p.head_dim == 64 ? launch(D64{}, std::true_type{}) : launch(D128{}, std::true_type{});
  else
    p.head_dim == 64 ? launch(D64{}, std::false_type{}) : launch(D128{}, std::false_type{});
  return true;
}

}  // namespace serval::cuda
