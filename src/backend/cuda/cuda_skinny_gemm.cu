// y = x @ W^T for 17..32 rows of x (decode batches of that many sequences),
// with the GEMV's fused forms: up to three weights in one launch (q/k/v) and
// silu(x @ gate^T) * (x @ up^T). Like the GEMV, a stream over W that must run
// at the HBM bandwidth; unlike it, x no longer fits a few registers per lane,
// so both operands go through shared memory.
//
// A block computes a 256 x 32 tile of y^T (256 W rows, 32 tokens; tokens past
// T are zeros) over a slice of the columns, in 64-column stages that cp.async
// fetches six deep (W with an L2 evict-first hint: it is read once per step).
// 8 warps as 4 (W rows) x 2 (tokens), each 64 x 16 of the tile, with
// mma.m16n8k16: A = 16 W rows, B = 8 tokens, f32 accumulators. Every block
// reads its slice of x from L2 again: 256 W rows per tile keep that at an
// eighth of the W bytes. Shared rows are 128 bytes with their 16-byte chunks
// XOR-swizzled by the row, so ldmatrix reads 8 rows of one column without
// bank conflicts.
//
// Few tiles (a 4096-row W has 16), so the columns are split in S slices
// (split-K), S chosen from the tile count alone (choose_splits). The S blocks
// of a tile form one thread block cluster: each leaves its f32 partial tile in
// its shared memory, and after a cluster barrier block r sums slice r of the
// outputs over all S partials (distributed shared memory), in the order
// 0..S-1. Nothing goes through global memory but x, W and y, and the sum's
// order is fixed.
//
// Why only up to 32 rows: on the H200 this kernel is bound by its instruction
// issue (mma.sync plus the ldmatrix and cp.async around it, one block of 8
// warps per SM), not by HBM. At 17..32 rows it beats cuBLASLt (7B decode
// steps 1-6% faster, docs/BENCHMARKS.md); at 48 and 64 rows it loses (4-8%),
// so those stay on cuBLASLt. Closing that needs wgmma and TMA loads.
//
// Batch invariance among 17..32 rows: a token's output is the same chain of
// mmas over the same columns in every split, then the same ordered sum, for
// any T in that range (S depends on the weight's shape only). It differs in
// rounding from the GEMV's (1..16 rows) order of sums.
#include <cooperative_groups.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_matmul_segments.cuh"
#include "backend/cuda/cuda_ptx.cuh"

namespace serval::cuda {

namespace {

namespace cg = cooperative_groups;

constexpr int kBM = 256;  // W rows per tile (gated: 128 of gate, then the same 128 of up)
constexpr int kBK = 64;   // columns per stage: one 128-byte shared row
constexpr int kBN = 32;   // tokens per tile: the most this kernel takes
constexpr int kStages = 6;  // 6 x 36 KB of shared memory: one block per SM, as many bytes in flight as fit
constexpr int kThreads = 256;
constexpr int kWarpsM = 4;
constexpr int kWarpM = kBM / kWarpsM;  // W rows per warp
constexpr int kMTiles = kWarpM / 16;   // m16 tiles per warp
constexpr int kMinStagesPerSplit = 4;  // below this the pipeline never fills
constexpr int kMaxSplits = 8;          // the portable cluster size
constexpr int kPartialPitch = kBM + 4;  // floats per token row of a partial tile (no bank conflicts)
constexpr int kMinTokens = 17, kMaxTokens = kBN;

// The operands (cuda_matmul_segments.cuh) and the column split.
struct SkinnyParams : MatmulSegments {
  int k_stages;          // ceil(in / kBK)
  int stages_per_split;  // ceil(k_stages / S)
};

constexpr int kSmemBytes = kStages * (kBM + kBN) * kBK * 2;

// Byte offset of (row, 16-byte chunk) in a stage's swizzled [rows][64] bf16 array.
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return uint32_t(row * (kBK * 2) + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ void cp_async_16_evict_first(uint32_t dst, const void* src, bool live, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
               "r"(live ? 16 : 0), "l"(policy)
               : "memory");
}

__device__ __forceinline__ void store_out(float* y, int64_t i, float v) { y[i] = v; }
__device__ __forceinline__ void store_out(bf16* y, int64_t i, float v) { y[i] = __float2bfloat16(v); }

template <typename Out, bool kGated>
__global__ void __launch_bounds__(kThreads, 1) skinny_gemm_kernel(const __grid_constant__ SkinnyParams p) {
  constexpr int kWarpN = kBN / 2;        // tokens per warp
  constexpr int kNTiles = kWarpN / 8;    // n8 tiles per warp
  constexpr int kXChunks = kBN * kBK / 8 / kThreads;  // x chunks per thread per stage
  constexpr int kWChunks = kBM * kBK / 8 / kThreads;  // W chunks per thread per stage
  constexpr int kOutCols = kGated ? kBM / 2 : kBM;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t w_smem = ptx::smem_u32(smem);
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

  const int wm = warp % kWarpsM, wn = warp / kWarpsM;
  float acc[kMTiles][kNTiles][4] = {};
  for (int s = 0; s < n_stages; ++s) {
    ptx::cp_async_wait<kStages - 2>();
    __syncthreads();  // stage s is in; everyone is done reading the slot refilled next
    if (s + kStages - 1 < n_stages) {
      load_w(s + kStages - 1);
      load_x(s + kStages - 1);
    }
    ptx::cp_async_commit();
    const uint32_t ws = w_smem + uint32_t((s % kStages) * kBM * kBK * 2);
    const uint32_t xs = x_smem + uint32_t((s % kStages) * kBN * kBK * 2);
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
  }
  ptx::cp_async_wait_all();
  pdl_launch_dependents();
  __syncthreads();  // the stage buffers become the partial tile

  // Partial tile [token][W row] in f32.
  float* part = reinterpret_cast<float*>(smem);
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
    for (int ni = 0; ni < kNTiles; ++ni) {
      const int m = wm * kWarpM + mi * 16 + g, n = wn * kWarpN + ni * 8 + 2 * q;
      part[n * kPartialPitch + m] = acc[mi][ni][0];
      part[(n + 1) * kPartialPitch + m] = acc[mi][ni][1];
      part[n * kPartialPitch + m + 8] = acc[mi][ni][2];
      part[(n + 1) * kPartialPitch + m + 8] = acc[mi][ni][3];
    }
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
      store_out(y, int64_t(t) * rows + base + j + i, o);
    }
  }
  cluster.sync();  // no block leaves while another may still read its partial
}

// Resident clusters of S blocks of one kernel variant on the whole GPU, times
// S: the block slots a grid of such clusters can fill at once.
template <typename Out, bool kGated>
int cluster_slots(int splits) {
  static std::mutex mu;
  static std::map<int, int> slots;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = slots.find(splits); it != slots.end()) return it->second;
  auto kernel = skinny_gemm_kernel<Out, kGated>;
  SERVAL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(splits * 64));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmemBytes;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(splits);
  attr[0].val.clusterDim.y = attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  SERVAL_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg));
  return slots[splits] = std::max(clusters, 1) * splits;
}

// The split count for `tiles` tiles of `k_stages` stages: a block's time is
// about its stages, k_stages / S, so the kernel's is waves / S with waves =
// ceil(tiles x S / slots(S)); the S that minimizes it, with at least
// kMinStagesPerSplit stages per split, fewer splits unless 3% faster. S (and
// with it every output's rounding) does not depend on T.
template <typename Out, bool kGated>
int choose_splits(int tiles, int k_stages) {
  int best = 1;
  double best_time = 0;
  for (int s = 1; s <= kMaxSplits; ++s) {
    const int per = ceil_div(k_stages, s);
    if (s > 1 && per < kMinStagesPerSplit) break;
    if ((s - 1) * per >= k_stages) continue;  // a split would have no columns
    const double time = double(ceil_div(tiles * s, cluster_slots<Out, kGated>(s))) * per;
    if (s == 1 || time < best_time * 0.97) {
      best_time = time;
      best = s;
    }
  }
  return best;
}

template <typename Out, bool kGated>
void launch(const MatmulSegments& segs, cudaStream_t stream) {
  if (segs.tiles == 0) return;
  SkinnyParams p;
  static_cast<MatmulSegments&>(p) = segs;
  p.k_stages = ceil_div(p.in, kBK);
  const int splits = choose_splits<Out, kGated>(p.tiles, p.k_stages);  // also sets the shared-memory limit
  p.stages_per_split = ceil_div(p.k_stages, splits);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(p.tiles * splits));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(splits);
  attr[0].val.clusterDim.y = attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 2 : 1;
  SERVAL_CUDA_CHECK(cudaLaunchKernelEx(&cfg, skinny_gemm_kernel<Out, kGated>, p));
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
