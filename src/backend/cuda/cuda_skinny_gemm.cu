// y = x @ W^T for 17..48 rows of x (decode batches of that many sequences),
// with the GEMV's fused forms: up to three weights in one launch (q/k/v) and
// silu(x @ gate^T) * (x @ up^T). Like the GEMV, a stream over W that must run
// at the HBM bandwidth; unlike it, x no longer fits a few registers per lane,
// so both operands go through shared memory.
//
// A block computes a 256 x BN tile of y^T (256 W rows; BN = 32 tokens, or 64
// for 33..48; tokens past T are zeros) over a slice of the columns, in
// 64-column stages that cp.async fetches five or six deep (W with an L2
// evict-first hint: it is read once per step). Shared rows are 128 bytes with
// their 16-byte chunks XOR-swizzled by the row (the 128-byte swizzle of
// Hopper's MMA operands). On sm_90a the two warpgroups each multiply 128 W rows
// by the tile's tokens with wgmma (64 x BN x 16 per instruction, operands
// straight from shared memory); the PTX for other GPUs uses mma.sync m16n8k16
// with ldmatrix instead, which issues ~4x the instructions: on the H200 that
// form was bound by instruction issue, not HBM, and lost to cuBLASLt beyond 32
// rows. Every block reads its slice of x from L2 again: 256 W rows per tile
// keep that at an eighth (BN 32) or a quarter (BN 64) of the W bytes.
//
// Few tiles (a 4096-row W has 16), so the columns are split in S slices
// (split-K), S chosen from the tile count alone (choose_splits). The S blocks
// of a tile form one thread block cluster: each leaves its f32 partial tile in
// its shared memory, and after a cluster barrier block r sums slice r of the
// outputs over all S partials (distributed shared memory), in the order
// 0..S-1. Nothing goes through global memory but x, W and y, and the sum's
// order is fixed.
//
// Why 48 rows: 7B decode steps are faster than through cuBLASLt at 20-48
// sequences and ~1% slower at 64 (docs/PERFORMANCE.md), so 49+ rows stay there.
//
// Batch invariance among 17..48 rows: a token's output is the same chain of
// MMAs over the same columns in every split, then the same ordered sum, for
// any T in that range (S depends on the weight's shape only). It differs in
// rounding from the GEMV's (1..16 rows) order of sums.
#include <cooperative_groups.h>

#include <algorithm>
#include <array>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_decode_matmul.h"
#include "backend/cuda/cuda_elem.cuh"
#include "backend/cuda/cuda_matmul_segments.cuh"
#include "backend/cuda/cuda_ptx.cuh"

namespace serval::cuda {

namespace {

namespace cg = cooperative_groups;

constexpr int kBM = 256;  // W rows per tile (gated: 128 of gate, then the same 128 of up)
constexpr int kBK = 64;   // columns per stage: one 128-byte shared row
// Tokens per tile: 32, or 64 for batches of 33..48. Stages of the ring: as
// many as fit one block per SM (6 x 36 KB, 5 x 40 KB).
template <int kBN>
__host__ __device__ constexpr int stages_for() {
  return kBN == 32 ? 6 : 5;
}
// Dynamic shared memory: the ring, and 1 KB to align it to the 1024 bytes a
// 128-byte-swizzled wgmma operand needs.
template <int kBN>
__host__ __device__ constexpr int smem_bytes() {
  return stages_for<kBN>() * (kBM + kBN) * kBK * 2 + 1024;
}
constexpr int kThreads = 256;
constexpr int kMinStagesPerSplit = 4;  // below this the pipeline never fills
constexpr int kMaxSplits = 8;          // the portable cluster size
constexpr int kPartialPitch = kBM + 4;  // floats per token row of a partial tile (no bank conflicts)
constexpr int kMinTokens = 17, kMaxTokens = 48;

// The operands (cuda_matmul_segments.cuh) and the column split.
struct SkinnyParams : MatmulSegments {
  int k_stages;          // ceil(in / kBK)
  int stages_per_split;  // ceil(k_stages / S)
};

// Byte offset of (row, 16-byte chunk) in a stage's swizzled [rows][64] bf16 array.
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return uint32_t(row * (kBK * 2) + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ void cp_async_16_evict_first(uint32_t dst, const void* src, bool live, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
               "r"(live ? 16 : 0), "l"(policy)
               : "memory");
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Hopper's warpgroup MMA (sm_90a): 64 W rows x N tokens x 16 columns per
// instruction, both operands read from shared memory through descriptors, so
// no ldmatrix and far fewer instructions than mma.sync.
//
// Descriptor of a K-major operand in the 128-byte-swizzled layout the stage
// loads write (rows of 64 bf16, 16-byte chunks XOR row % 8, 8-row atoms of
// 1024 bytes): start address, leading byte offset (unused when swizzled: 1),
// stride byte offset 1024 (from one 8-row atom to the next), swizzle mode 1.
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Shared memory this thread wrote through cp.async (the generic proxy)
// becomes visible to wgmma (the async proxy); a barrier after it extends that
// to the other threads' wgmma.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// d[64 x 32] += A[64 x 16] * B[16 x 32], f32 accumulators (16 per thread).
__device__ __forceinline__ void wgmma_n32(float (&d)[16], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(a), "l"(b));
}
// d[64 x 64] += A[64 x 16] * B[16 x 64] (32 accumulators per thread).
__device__ __forceinline__ void wgmma_n64(float (&d)[32], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b));
}
template <int kBN>
__device__ __forceinline__ void wgmma_tile(float (&d)[kBN / 2], uint64_t a, uint64_t b) {
  if constexpr (kBN == 32)
    wgmma_n32(d, a, b);
  else
    wgmma_n64(d, a, b);
}
#endif

template <int kBN, typename Out, bool kGated>
__global__ void __launch_bounds__(kThreads, 1) skinny_gemm_kernel(const __grid_constant__ SkinnyParams p) {
  constexpr int kStages = stages_for<kBN>();
  constexpr int kXChunks = kBN * kBK / 8 / kThreads;  // x chunks per thread per stage
  constexpr int kWChunks = kBM * kBK / 8 / kThreads;  // W chunks per thread per stage
  constexpr int kOutCols = kGated ? kBM / 2 : kBM;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t raw_s = ptx::smem_u32(smem_raw);
  const uint32_t w_smem = (raw_s + 1023) & ~1023u;  // 1024-aligned: the swizzle is on address bits
  unsigned char* smem = smem_raw + (w_smem - raw_s);
  const uint32_t x_smem = w_smem + kStages * kBM * kBK * 2;

  cg::cluster_group cluster = cg::this_cluster();
  const int splits = int(cluster.num_blocks());
  const int split = int(cluster.block_rank());
  const int tile = int(blockIdx.x) / splits;
  int seg, base;  // the tile's weight and first output row in it
  locate_tile(p, tile, kOutCols, seg, base);
  const int rows = p.rows[seg];
  const int stage_begin = split * p.stages_per_split;
  const int n_stages = max(0, min(p.k_stages, stage_begin + p.stages_per_split) - stage_begin);

  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));

  // This thread loads chunk `chunk` of rows tid / 8 + 32 u (u < kWChunks) of
  // every stage's W tile (gated: the first half from gate, the second from up).
  const int chunk = tid & 7;
  const bf16* w_seg = p.w[seg];
  auto load_w = [&](int s) {
    const int col = (stage_begin + s) * kBK + chunk * 8;
    const uint32_t dst = w_smem + uint32_t((s % kStages) * kBM * kBK * 2);
#pragma unroll
    for (int u = 0; u < kWChunks; ++u) {
      const int r = (tid >> 3) + u * (kThreads / 8);
      const bool up_half = kGated && u >= kWChunks / 2;  // r >= kBM / 2
      const int row = base + r - (up_half ? kBM / 2 : 0);
      const bf16* w = kGated ? (up_half ? p.w[1] : p.w[0]) : w_seg;
      const bool ok = row < rows && col < p.in;
      cp_async_16_evict_first(dst + swz(r, chunk), w + (ok ? int64_t(row) * p.in + col : 0), ok, policy);
    }
  };
  auto load_x = [&](int s) {
    const int col = (stage_begin + s) * kBK + chunk * 8;
    const uint32_t dst = x_smem + uint32_t((s % kStages) * kBN * kBK * 2);
#pragma unroll
    for (int u = 0; u < kXChunks; ++u) {
      const int t = (tid + u * kThreads) >> 3;
      const bool ok = t < p.tokens && col < p.in;
      ptx::cp_async_16(dst + swz(t, chunk), p.x + (ok ? int64_t(t) * p.in + col : 0), ok);
    }
  };

  // Prologue: the first stages' weights before waiting for the kernel that
  // writes x (programmatic dependent launch), then their x. One commit group
  // each, so the main loop's wait counts hold: W0..W2, X0..X2, then S3, S4, ...
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_stages) load_w(s);
    ptx::cp_async_commit();
  }
  pdl_wait();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_stages) load_x(s);
    ptx::cp_async_commit();
  }

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // Warpgroup wg takes W rows 128 wg .. 128 wg + 127 (two 64-row wgmma tiles)
  // against all kBN tokens.
  const int wg = warp >> 2;
  float acc[2][kBN / 2] = {};
#else
  // mma.sync (PTX for other GPUs): 8 warps as 4 (W rows) x 2 (tokens), each
  // 64 x kBN / 2 of the tile; A = 16 W rows, B = 8 tokens.
  constexpr int kWarpsM = 4, kWarpM = kBM / kWarpsM, kMTiles = kWarpM / 16;
  constexpr int kWarpN = kBN / 2, kNTiles = kWarpN / 8;
  const int wm = warp % kWarpsM, wn = warp / kWarpsM;
  float acc[kMTiles][kNTiles][4] = {};
#endif
  for (int s = 0; s < n_stages; ++s) {
    ptx::cp_async_wait<kStages - 2>();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    fence_proxy_async();  // this thread's copies of stage s, before the barrier that hands them to wgmma
#endif
    __syncthreads();  // stage s is in; everyone is done reading the slot refilled next
    if (s + kStages - 1 < n_stages) {
      load_w(s + kStages - 1);
      load_x(s + kStages - 1);
    }
    ptx::cp_async_commit();
    const uint32_t ws = w_smem + uint32_t((s % kStages) * kBM * kBK * 2);
    const uint32_t xs = x_smem + uint32_t((s % kStages) * kBN * kBK * 2);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk)
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
        wgmma_tile<kBN>(acc[mi], wgmma_desc(ws + uint32_t((wg * 128 + mi * 64) * kBK * 2 + kk * 32)),
                        wgmma_desc(xs + uint32_t(kk * 32)));
    wgmma_commit();
    wgmma_wait_all();  // before the next barrier lets this stage's slot be refilled
#else
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi)
        ptx::ldmatrix_x4(a[mi], ws + swz(wm * kWarpM + mi * 16 + (lane & 15), kk * 2 + (lane >> 4)));
#pragma unroll
      for (int nj = 0; nj < kNTiles / 2; ++nj) {
        uint32_t b[4];
        const int t = wn * kWarpN + nj * 16 + (lane & 7) + ((lane >> 4) << 3);
        ptx::ldmatrix_x4(b, xs + swz(t, kk * 2 + ((lane >> 3) & 1)));
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi) {
          ptx::mma_bf16_16816(acc[mi][2 * nj], a[mi], b[0], b[1]);
          ptx::mma_bf16_16816(acc[mi][2 * nj + 1], a[mi], b[2], b[3]);
        }
      }
    }
#endif
  }
  ptx::cp_async_wait_all();
  pdl_launch_dependents();
  __syncthreads();  // the stage buffers become the partial tile

  // Partial tile [token][W row] in f32. Both MMA forms leave, per 16 rows and
  // 8 tokens, lane (g, q) with rows g and g + 8 of tokens 2q and 2q + 1.
  float* part = reinterpret_cast<float*>(smem);
  const int g = lane >> 2, q = lane & 3;
  auto store_frag = [&](int m, int n, const float* f) {
    part[n * kPartialPitch + m] = f[0];
    part[(n + 1) * kPartialPitch + m] = f[1];
    part[n * kPartialPitch + m + 8] = f[2];
    part[(n + 1) * kPartialPitch + m + 8] = f[3];
  };
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j)
      store_frag(wg * 128 + mi * 64 + (warp & 3) * 16 + g, 8 * j + 2 * q, &acc[mi][4 * j]);
#else
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
    for (int ni = 0; ni < kNTiles; ++ni)
      store_frag(wm * kWarpM + mi * 16 + g, wn * kWarpN + ni * 8 + 2 * q, acc[mi][ni]);
#endif
  cluster.sync();  // every partial of the tile is written

  // Block `split` sums its share of the tile's outputs over the S partials,
  // four consecutive outputs per thread and round: all S (gated: 2S) remote
  // loads of a round are issued before any is used.
  const int T = min(p.tokens, kBN);
  constexpr int kQuads = kOutCols / 4;
  const int total = T * kQuads;
  const int begin = int(int64_t(total) * split / splits), end = int(int64_t(total) * (split + 1) / splits);
  Out* y = static_cast<Out*>(p.y[seg]);
  for (int e = begin + tid; e < end; e += kThreads) {
    const int t = e / kQuads, j = (e % kQuads) * 4;
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f), sum_up = sum;
    float4 v[kMaxSplits], u[kGated ? kMaxSplits : 1];
#pragma unroll
    for (int r = 0; r < kMaxSplits; ++r) {
      if (r >= splits) break;
      const float* rp = cluster.map_shared_rank(part, r) + t * kPartialPitch + j;
      v[r] = *reinterpret_cast<const float4*>(rp);
      if constexpr (kGated) u[r] = *reinterpret_cast<const float4*>(rp + kBM / 2);
    }
#pragma unroll
    for (int r = 0; r < kMaxSplits; ++r) {
      if (r >= splits) break;
      sum.x += v[r].x, sum.y += v[r].y, sum.z += v[r].z, sum.w += v[r].w;
      if constexpr (kGated) sum_up.x += u[r].x, sum_up.y += u[r].y, sum_up.z += u[r].z, sum_up.w += u[r].w;
    }
    float out[4] = {sum.x, sum.y, sum.z, sum.w};
    const float ups[4] = {sum_up.x, sum_up.y, sum_up.z, sum_up.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (base + j + i >= rows) break;
      float o = out[i];
      if constexpr (kGated) o = o / (1.0f + __expf(-o)) * ups[i];
      store1(y, int64_t(t) * rows + base + j + i, o);
    }
  }
  cluster.sync();  // no block leaves while another may still read its partial
}

// The launch of `blocks` blocks of `smem` bytes in clusters of `splits` (and,
// with `pdl`, as a programmatic dependent); `attr` holds its attributes.
cudaLaunchConfig_t cluster_launch(unsigned blocks, int splits, int smem, cudaStream_t stream, bool pdl,
                                  cudaLaunchAttribute (&attr)[2]) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = size_t(smem);
  cfg.stream = stream;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(splits);
  attr[0].val.clusterDim.y = attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 2 : 1;
  return cfg;
}

// For one kernel variant, set up on first use (its shared-memory limit): for
// each split count S, the resident clusters of S blocks on the whole GPU times
// S, the block slots a grid of such clusters can fill at once (0: this GPU
// cannot place such a cluster at all).
using SplitSlots = std::array<int, kMaxSplits + 1>;
template <int kBN, typename Out, bool kGated>
const SplitSlots& variant_slots() {
  static const SplitSlots slots = [] {
    auto kernel = skinny_gemm_kernel<kBN, Out, kGated>;
    SERVAL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes<kBN>()));
    SplitSlots out{};
    for (int s = 1; s <= kMaxSplits; ++s) {
      cudaLaunchAttribute attr[2];
      const cudaLaunchConfig_t cfg = cluster_launch(unsigned(s * 64), s, smem_bytes<kBN>(), nullptr, false, attr);
      int clusters = 0;
      SERVAL_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg));
      out[size_t(s)] = clusters * s;
    }
    return out;
  }();
  return slots;
}

// The split count for `tiles` tiles of `k_stages` stages: a block's time is
// about its stages, k_stages / S, so the kernel's is waves / S with waves =
// ceil(tiles x S / slots(S)); the S that minimizes it, with at least
// kMinStagesPerSplit stages per split, fewer splits unless 3% faster. Counted
// with the 64-token variant's slots for both, so that S (and with it every
// output's rounding) does not depend on T.
template <typename Out, bool kGated>
int choose_splits(int tiles, int k_stages) {
  const SplitSlots& slots = variant_slots<64, Out, kGated>();
  SERVAL_CHECK(slots[1] > 0, "skinny_gemm: no block of ", smem_bytes<64>(), " bytes of shared memory fits this GPU");
  int best = 1;
  double best_time = 0;
  for (int s = 1; s <= kMaxSplits; ++s) {
    const int per = ceil_div(k_stages, s);
    if (s > 1 && per < kMinStagesPerSplit) break;
    if ((s - 1) * per >= k_stages) continue;  // a split would have no columns
    if (slots[size_t(s)] == 0) continue;      // clusters of s blocks do not fit
    const double time = double(ceil_div(tiles * s, slots[size_t(s)])) * per;
    if (s == 1 || time < best_time * 0.97) {
      best_time = time;
      best = s;
    }
  }
  return best;
}

template <int kBN, typename Out, bool kGated>
void launch_as(const MatmulSegments& segs, cudaStream_t stream) {
  if (segs.tiles == 0) return;
  variant_slots<kBN, Out, kGated>();  // this variant's shared-memory limit, on first use
  SkinnyParams p;
  static_cast<MatmulSegments&>(p) = segs;
  p.k_stages = ceil_div(p.in, kBK);
  const int splits = choose_splits<Out, kGated>(p.tiles, p.k_stages);
  p.stages_per_split = ceil_div(p.k_stages, splits);
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t cfg =
      cluster_launch(unsigned(p.tiles * splits), splits, smem_bytes<kBN>(), stream, pdl_enabled(), attr);
  SERVAL_CUDA_CHECK(cudaLaunchKernelEx(&cfg, skinny_gemm_kernel<kBN, Out, kGated>, p));
}

template <typename Out, bool kGated>
void launch(const MatmulSegments& p, cudaStream_t stream) {
  if (p.tokens <= 32)
    launch_as<32, Out, kGated>(p, stream);
  else
    launch_as<64, Out, kGated>(p, stream);
}

}  // namespace

bool skinny_gemm_fits(const Tensor& x) {
  return x.dtype == DType::BF16 && x.rows >= kMinTokens && x.rows <= kMaxTokens && x.cols >= 8 &&
         x.cols % 8 == 0 && x.cols <= (int64_t(1) << 30) && reinterpret_cast<uintptr_t>(x.data) % 16 == 0;
}

// ys[i] = x @ ws[i]^T for 1..3 weights; bf16 outputs, or a single f32 one.
void skinny_gemm(const Tensor& x, const bf16* const* ws, const Tensor* ys, int n, cudaStream_t stream) {
  SERVAL_CHECK(skinny_gemm_fits(x), "skinny_gemm: x [", x.rows, ", ", x.cols, "] does not fit the kernel");
  const MatmulSegments p = matmul_segments(x, ws, ys, n, kBM, "skinny_gemm");
  if (ys[0].dtype == DType::F32)
    launch<float, false>(p, stream);
  else
    launch<bf16, false>(p, stream);
}

// out = silu(x @ gate^T) * (x @ up^T), bf16; gate and up are [out.cols, x.cols].
void skinny_gemm_gated(const Tensor& x, const bf16* gate, const bf16* up, Tensor out, cudaStream_t stream) {
  SERVAL_CHECK(skinny_gemm_fits(x), "skinny_gemm_gated: x [", x.rows, ", ", x.cols, "] does not fit the kernel");
  launch<bf16, true>(gated_segments(x, gate, up, out, kBM / 2, "skinny_gemm_gated"), stream);
}

}  // namespace serval::cuda
