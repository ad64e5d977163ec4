// How fast HBM streams a bf16 weight matrix W [R x K] into shared memory
// through a cp.async ring (what the skinny GEMM's stages did, without the MMAs,
// x or the epilogue), by the shape of a stage: 32 KB as 256 rows x 128 bytes
// (the skinny GEMM's) down to 16 rows x 2 KB (closer to the GEMV's long runs
// per row). Block b reads rows 256 (b / S) .. + 255 over column slice b % S
// (split-K by S); stages go column block by column block, row group by row
// group inside one. Five 32 KB stages, four in flight, one block per SM.
// Each launch reads other copies of W than the last (>= 2 GB in all), so L2
// serves none of it. Counters: GB/s of W, and that over the copy bandwidth.
//
// Question it answered (diary session 5, docs/PERFORMANCE.md): whether 128-byte runs
// per row cost DRAM efficiency (they cost 1-4%; short per-block runs cost more).
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

constexpr int kThreads = 256, kStageBytes = 32768, kStages = 5, kTileRows = 256;
constexpr double kCopyGBs = 4261.0;  // issue 5's measured H200 copy bandwidth

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

__device__ __forceinline__ void cp16(uint32_t dst, const void* src, bool hint, uint64_t policy) {
  if (hint)
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "l"(policy)
                 : "memory");
  else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}

template <int kRowsPerStage>
__global__ void __launch_bounds__(kThreads, 1) stream_kernel(const uint16_t* w, int K, int splits, bool hint,
                                                             float* sink) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kRowBytes = kStageBytes / kRowsPerStage, kRowChunks = kRowBytes / 16;
  const int tile = int(blockIdx.x) / splits, split = int(blockIdx.x) % splits;
  const int cols = K / splits, col0 = split * cols;
  const int groups = kTileRows / kRowsPerStage, n = groups * (cols * 2 / kRowBytes);
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  const uint32_t base = uint32_t(__cvta_generic_to_shared(smem));
  auto load = [&](int s) {
    const int cb = s / groups, g = s % groups;
    const uint32_t dst = base + uint32_t((s % kStages) * kStageBytes);
#pragma unroll
    for (int u = 0; u < kStageBytes / 16 / kThreads; ++u) {
      const int i = int(threadIdx.x) + u * kThreads, r = i / kRowChunks, c = i % kRowChunks;
      const int64_t row = int64_t(tile) * kTileRows + g * kRowsPerStage + r;
      cp16(dst + uint32_t(i * 16), w + row * K + col0 + cb * (kRowBytes / 2) + c * 8, hint, policy);
    }
  };
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n) load(s);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }
  float acc = 0;
  for (int s = 0; s < n; ++s) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2) : "memory");
    __syncthreads();
    if (s + kStages - 1 < n) load(s + kStages - 1);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    acc += float(smem[(s % kStages) * kStageBytes + threadIdx.x * 4]);  // touch the stage
  }
  if (acc == -1.f) *sink = acc;
}

template <int kRowsPerStage>
void launch(const uint16_t* w, int R, int K, int splits, bool hint, float* sink, cudaStream_t s) {
  static const bool smem_set = (check(cudaFuncSetAttribute(stream_kernel<kRowsPerStage>,
                                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                           kStages * kStageBytes),
                                      "smem"),
                                true);
  (void)smem_set;
  stream_kernel<kRowsPerStage>
      <<<unsigned(R / kTileRows * splits), kThreads, kStages * kStageBytes, s>>>(w, K, splits, hint, sink);
}

void launch_any(int rps, const uint16_t* w, int R, int K, int splits, bool hint, float* sink, cudaStream_t s) {
  switch (rps) {
    case 256: return launch<256>(w, R, K, splits, hint, sink, s);
    case 128: return launch<128>(w, R, K, splits, hint, sink, s);
    case 64: return launch<64>(w, R, K, splits, hint, sink, s);
    case 32: return launch<32>(w, R, K, splits, hint, sink, s);
    default: return launch<16>(w, R, K, splits, hint, sink, s);
  }
}

// Args: R, K, S (splits), rows per stage, L2 hints (evict-first + 256-byte fetch) on/off.
void BM_StreamPattern(benchmark::State& state) {
  const int R = int(state.range(0)), K = int(state.range(1)), S = int(state.range(2));
  const int rps = int(state.range(3));
  const bool hint = state.range(4) != 0;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  if ((K / S * 2) % (kStageBytes / rps) != 0 || R % kTileRows != 0) {
    state.SkipWithError("shape does not cut into whole stages");
    return;
  }
  const int64_t bytes = int64_t(R) * K * 2;
  const int copies = int((int64_t(2) << 30) / bytes) + 1;
  uint16_t* w = nullptr;
  float* sink = nullptr;
  check(cudaMalloc(&w, size_t(bytes) * size_t(copies)), "malloc");
  check(cudaMemset(w, 1, size_t(bytes) * size_t(copies)), "memset");
  check(cudaMalloc(&sink, 4), "malloc");
  cudaStream_t s = nullptr;
  cudaEvent_t a = nullptr, b = nullptr;
  check(cudaStreamCreate(&s), "stream");
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  for (int c = 0; c < copies; ++c) launch_any(rps, w + int64_t(c) * R * K, R, K, S, hint, sink, s);
  double total_s = 0;
  for (auto _ : state) {
    check(cudaEventRecord(a, s), "record");
    for (int c = 0; c < copies; ++c) launch_any(rps, w + int64_t(c) * R * K, R, K, S, hint, sink, s);
    check(cudaEventRecord(b, s), "record");
    check(cudaEventSynchronize(b), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "elapsed");
    state.SetIterationTime(double(ms) / 1e3 / copies);  // per launch
    total_s += double(ms) / 1e3;
  }
  check(cudaGetLastError(), "launch");
  const double gbs = double(bytes) * copies * double(state.iterations()) / total_s / 1e9;
  state.counters["GB/s"] = gbs;
  state.counters["of_copy_bw"] = gbs / kCopyGBs;
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(s);
  cudaFree(sink);
  cudaFree(w);
}

// 132 blocks with one long run each; 132 blocks of half the length; 128 blocks
// of 1 KB per row (the 7B o-projection split 8 ways); 352 blocks in ~2.7
// waves (like the 7B gate/up at 64 rows).
void shapes(benchmark::internal::Benchmark* b) {
  struct Shape {
    int64_t R, K, S;
  };
  for (const Shape& sh : {Shape{33792, 4096, 1}, Shape{16896, 4096, 2}, Shape{4096, 4096, 8}, Shape{22528, 4096, 4}}) {
    for (int64_t rps : {256, 128, 64, 32, 16}) b->Args({sh.R, sh.K, sh.S, rps, 1});
    b->Args({sh.R, sh.K, sh.S, 256, 0});
    b->Args({sh.R, sh.K, sh.S, 16, 0});
  }
}
BENCHMARK(BM_StreamPattern)->Apply(shapes)->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.05);

}  // namespace

BENCHMARK_MAIN();
