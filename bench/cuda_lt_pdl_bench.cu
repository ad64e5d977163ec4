// Could cuBLASLt's matmuls be programmatic dependents (PDL) of the kernel
// before them in a CUDA graph, and what would that be worth? cuBLASLt takes no
// launch attributes, but a captured graph's edges can be made programmatic
// afterwards. That is only correct if the matmul's kernel waits
// (griddepcontrol.wait) before reading its inputs.
//
// 1. Probe: a writer kernel releases its dependents at once, spins 40 us, then
//    writes x = 1; a matmul reads x. With a programmatic edge writer -> matmul,
//    a kernel that does not wait reads the old x (zeros: "stale"); one that
//    waits returns the product of the new x, bitwise as an ordinary launch
//    does. Every heuristic candidate of the 7B decode shapes is probed.
// 2. The same probe with a writer that releases its dependents only at its
//    end, after its stores and a __threadfence(): the matmul then starts after
//    every store has reached L2. That is outside the documented contract
//    (only griddepcontrol.wait promises visibility), so the probe checks
//    whether the hardware sees the new x anyway, many times per candidate.
// 3. What is at stake: 32 layers of (small PDL kernel -> matmul) x 4, at T
//    rows, replayed as a graph with ordinary edges and with programmatic edges
//    into the matmuls, the small kernel releasing its dependents early (the
//    probe says whether that computes garbage: then its time is only an upper
//    bound) or at its end (the second probe).
// 4. Whether the small kernel can hide the matmul's start another way: before
//    its dependency wait it asks L2 to prefetch the start of each of the next
//    matmul's K splits (a fraction of the weight; cp.async.bulk.prefetch.L2,
//    which the kernel does not wait for), so the matmul's first stages come
//    from L2 while HBM would otherwise idle between the two kernels.
//
// Usage: cuda_lt_pdl_bench [T]   (default 64)
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

// Any failing CUDA or cuBLASLt call ends the program, naming the call.
static void check(bool ok, const char* call, const char* file, int line, const char* why) {
  if (ok) return;
  std::fprintf(stderr, "%s:%d %s: %s\n", file, line, call, why);
  std::exit(1);
}
#define CK(x)                                                                   \
  do {                                                                          \
    const cudaError_t e_ = (x);                                                 \
    check(e_ == cudaSuccess, #x, __FILE__, __LINE__, cudaGetErrorString(e_));   \
  } while (0)
#define LK(x)                                                                             \
  do {                                                                                    \
    const cublasStatus_t s_ = (x);                                                        \
    check(s_ == CUBLAS_STATUS_SUCCESS, #x, __FILE__, __LINE__, cublasLtGetStatusString(s_)); \
  } while (0)

using bf16 = __nv_bfloat16;

// Releases this block's dependents: at once, or (kLate) once its stores are
// fenced, so that a dependent that does not wait starts after them.
template <bool kLate>
__device__ __forceinline__ void release_dependents() {
  if (kLate) __threadfence();
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// Releases its dependents at once (kLate: only after its stores and a fence),
// spins, then writes x = 1.
template <bool kLate>
__global__ void slow_writer(bf16* x, int n, long long spin_ns) {
  if (!kLate) release_dependents<false>();
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < (unsigned long long)spin_ns);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = __float2bfloat16(1.0f);
  if (kLate) release_dependents<true>();
}

// The small kernels' work (they stand for norm, rope, silu between the
// matmuls): waits, releases its dependents (kLate: only after its stores and
// a fence), copies n elements.
template <bool kLate>
__device__ __forceinline__ void wait_and_copy(const bf16* in, bf16* out, int n) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (!kLate) release_dependents<false>();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = in[i];
  if (kLate) release_dependents<true>();
}

template <bool kLate>
__global__ void small_copy(const bf16* in, bf16* out, int n) {
  wait_and_copy<kLate>(in, out, n);
}

// What small_copy_prefetch asks L2 for: of each of `rows` rows of `pitch`
// bytes, `chunk` bytes at the start of each of `splits` equal column ranges
// (rounded down to the 16 bytes the bulk prefetch needs).
struct Prefetch {
  const char* w;
  int rows, splits;
  unsigned pitch, chunk;
};

__global__ void small_copy_prefetch(const bf16* in, bf16* out, int n, Prefetch pf) {
  const int jobs = pf.rows * pf.splits;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < jobs; j += gridDim.x * blockDim.x) {
    const int row = j / pf.splits, split = j % pf.splits;
    const char* a = pf.w + size_t(row) * pf.pitch + (size_t(split) * (pf.pitch / pf.splits) & ~size_t(15));
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(pf.chunk) : "memory");
  }
  wait_and_copy<false>(in, out, n);
}

__global__ void fill_random(bf16* w, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned h = unsigned(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    w[i] = __float2bfloat16((float(h & 0xffff) / 65536.0f - 0.5f) * 0.04f);
  }
}

struct Gemm {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, d;
  int n, k, t;
};

static cublasLtHandle_t lt;
static void* workspace;
static constexpr size_t kWorkspace = 64ull << 20;

// y[t, n] = x[t, k] W[n, k]^T, row-major (column-major: D(n x t) = W^T-op . x).
static Gemm make_gemm(int n, int k, int t) {
  Gemm g{};
  g.n = n, g.k = k, g.t = t;
  LK(cublasLtMatmulDescCreate(&g.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  LK(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  LK(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  LK(cublasLtMatrixLayoutCreate(&g.a, CUDA_R_16BF, k, n, k));
  LK(cublasLtMatrixLayoutCreate(&g.b, CUDA_R_16BF, k, t, k));
  LK(cublasLtMatrixLayoutCreate(&g.d, CUDA_R_16BF, n, t, n));
  return g;
}

// cuBLASLt's heuristic candidates for g, up to 8, into r; returns how many.
// (Plain arrays: nvcc 13 in C++20 mode fails on a std::vector of cuBLASLt's structs.)
static int candidates(const Gemm& g, cublasLtMatmulHeuristicResult_t (&r)[8]) {
  cublasLtMatmulPreference_t pref;
  LK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = kWorkspace;
  LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  int got = 0;
  LK(cublasLtMatmulAlgoGetHeuristic(lt, g.op, g.a, g.b, g.d, g.d, pref, 8, r, &got));
  cublasLtMatmulPreferenceDestroy(pref);
  return got;
}

static void run_gemm(const Gemm& g, const cublasLtMatmulAlgo_t& algo, const bf16* w, const bf16* x, bf16* y,
                     cudaStream_t s) {
  const float one = 1.f, zero = 0.f;
  LK(cublasLtMatmul(lt, g.op, &one, w, g.a, x, g.b, &zero, y, g.d, y, g.d, &algo, workspace, kWorkspace, s));
}

static bool is_kernel(cudaGraphNode_t n) {
  cudaGraphNodeType t;
  CK(cudaGraphNodeGetType(n, &t));
  return t == cudaGraphNodeTypeKernel;
}

static const void* node_func(cudaGraphNode_t n) {
  cudaKernelNodeParams p{};
  if (cudaGraphKernelNodeGetParams(n, &p) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return p.func;
}

// Every ordinary edge from one of `ours` (kernel functions) into a kernel node
// that is not ours becomes programmatic. Returns how many.
static int make_programmatic(cudaGraph_t g, const std::vector<const void*>& ours) {
  size_t n = 0;
  CK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  CK(cudaGraphGetNodes(g, nodes.data(), &n));
  auto is_ours = [&](cudaGraphNode_t x) {
    if (!is_kernel(x)) return false;
    const void* f = node_func(x);
    for (const void* o : ours)
      if (f == o) return true;
    return false;
  };
  int changed = 0;
  for (cudaGraphNode_t to : nodes) {
    if (!is_kernel(to) || is_ours(to)) continue;
    size_t nd = 0;
    CK(cudaGraphNodeGetDependencies(to, nullptr, nullptr, &nd));
    std::vector<cudaGraphNode_t> deps(nd);
    std::vector<cudaGraphEdgeData> ed(nd);
    CK(cudaGraphNodeGetDependencies(to, deps.data(), ed.data(), &nd));
    for (size_t i = 0; i < nd; ++i) {
      if (ed[i].type != cudaGraphDependencyTypeDefault || !is_ours(deps[i])) continue;
      CK(cudaGraphRemoveDependencies(g, &deps[i], &to, &ed[i], 1));
      cudaGraphEdgeData e{};
      e.from_port = cudaGraphKernelNodePortProgrammatic;
      e.type = cudaGraphDependencyTypeProgrammatic;
      CK(cudaGraphAddDependencies(g, &deps[i], &to, &e, 1));
      ++changed;
    }
  }
  return changed;
}

static void launch_small(bool late, const bf16* in, bf16* out, int n, cudaStream_t s, const Prefetch* pf = nullptr) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(64);
  cfg.blockDim = dim3(256);
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  if (pf)
    CK(cudaLaunchKernelEx(&cfg, small_copy_prefetch, in, out, n, *pf));
  else
    CK(cudaLaunchKernelEx(&cfg, late ? small_copy<true> : small_copy<false>, in, out, n));
}

enum class Probe { kWaits, kStale, kOther, kNoEdge };

// Probes one candidate.
static Probe probe(bool late, const Gemm& g, const cublasLtMatmulAlgo_t& algo, const bf16* w, bf16* x, bf16* y,
                   cudaStream_t s) {
  auto writer = late ? slow_writer<true> : slow_writer<false>;
  const size_t nx = size_t(g.t) * g.k, ny = size_t(g.t) * g.n;
  std::vector<uint16_t> ref(ny), got(ny);  // bf16 bits
  // Reference: x = 1, ordinary launch.
  writer<<<8, 256, 0, s>>>(x, int(nx), 0);
  run_gemm(g, algo, w, x, y, s);
  CK(cudaStreamSynchronize(s));
  CK(cudaMemcpy(ref.data(), y, ny * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemsetAsync(y, 0xff, ny * 2, s));
  cudaGraph_t graph;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  CK(cudaMemsetAsync(x, 0, nx * 2, s));
  writer<<<8, 256, 0, s>>>(x, int(nx), 40000);
  run_gemm(g, algo, w, x, y, s);
  CK(cudaStreamEndCapture(s, &graph));
  const int changed = make_programmatic(graph, {reinterpret_cast<const void*>(writer)});
  cudaGraphExec_t exec;
  CK(cudaGraphInstantiate(&exec, graph, 0));
  CK(cudaGraphLaunch(exec, s));
  CK(cudaStreamSynchronize(s));
  CK(cudaMemcpy(got.data(), y, ny * 2, cudaMemcpyDeviceToHost));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  if (changed == 0) return Probe::kNoEdge;  // the matmul starts with a node that is not a kernel
  if (std::memcmp(ref.data(), got.data(), ny * 2) == 0) return Probe::kWaits;
  size_t zeros = 0;
  for (size_t i = 0; i < ny; ++i) zeros += (got[i] & 0x7fff) == 0;
  return zeros * 2 > ny ? Probe::kStale : Probe::kOther;
}

int main(int argc, char** argv) {
  const int T = argc > 1 ? std::atoi(argv[1]) : 64;
  CK(cudaSetDevice(0));
  LK(cublasLtCreate(&lt));
  CK(cudaMalloc(&workspace, kWorkspace));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::printf("cuBLASLt version %zu\n", cublasLtGetVersion());

  struct Shape {
    const char* name;
    int n, k;
  };
  const Shape shapes[] = {{"qkv", 12288, 4096}, {"o", 4096, 4096}, {"gate_up", 22016, 4096}, {"down", 4096, 11008}};
  constexpr int kLayers = 32;
  std::vector<bf16*> w[4];
  for (int i = 0; i < 4; ++i)
    for (int l = 0; l < kLayers; ++l) {
      bf16* p;
      const size_t n = size_t(shapes[i].n) * shapes[i].k;
      CK(cudaMalloc(&p, n * 2));
      fill_random<<<1024, 256>>>(p, n, unsigned(i * 100 + l));
      w[i].push_back(p);
    }
  bf16 *x, *y, *z;
  CK(cudaMalloc(&x, size_t(256) * 22016 * 2));
  CK(cudaMalloc(&y, size_t(256) * 22016 * 2));
  CK(cudaMalloc(&z, size_t(256) * 22016 * 2));
  fill_random<<<1024, 256>>>(x, size_t(256) * 22016, 7);
  CK(cudaDeviceSynchronize());

  // 1. The probes, at T rows and at 32 and 256: the writer releasing its
  // dependents at once, and at its end (kLateReps times per candidate).
  constexpr int kLateReps = 20;
  bool all_wait = true, all_late_fresh = true;
  cublasLtMatmulAlgo_t best[4];
  for (int tt : {T, 32, 256}) {
    for (int i = 0; i < 4; ++i) {
      Gemm g = make_gemm(shapes[i].n, shapes[i].k, tt);
      cublasLtMatmulHeuristicResult_t c[8];
      const int nc = candidates(g, c);
      int count[4] = {}, late[4] = {};
      for (int a = 0; a < nc; ++a) {
        ++count[int(probe(false, g, c[a].algo, w[i][0], x, y, s))];
        for (int r = 0; r < kLateReps; ++r) ++late[int(probe(true, g, c[a].algo, w[i][0], x, y, s))];
      }
      all_wait = all_wait && count[int(Probe::kWaits)] == nc;
      all_late_fresh = all_late_fresh && late[int(Probe::kWaits)] + late[int(Probe::kNoEdge)] == nc * kLateReps;
      std::printf("probe T=%3d %-8s %d candidates: %d wait, %d stale, %d other results, %d start with no kernel"
                  " | writer releasing at its end, %d runs: %d fresh, %d stale, %d other, %d no kernel\n",
                  tt, shapes[i].name, nc, count[0], count[1], count[2], count[3], nc * kLateReps, late[0], late[1],
                  late[2], late[3]);
      if (tt == T) best[i] = c[0].algo;
    }
  }
  std::printf("probe verdict: %s\n", all_wait ? "every candidate waits: programmatic edges into cuBLASLt are safe"
                                              : "some candidates do not wait: programmatic edges into cuBLASLt are NOT safe");
  std::printf("late-release verdict: %s\n",
              all_late_fresh ? "every run read the new x when the writer released at its end (fence, then release)"
                             : "some runs read a stale x even with the release at the writer's end");

  // 2. Timing: 32 layers of (small -> qkv -> small -> o -> small -> gate_up -> small -> down).
  Gemm g[4];
  for (int i = 0; i < 4; ++i) g[i] = make_gemm(shapes[i].n, shapes[i].k, T);
  enum class Edges { kOrdinary, kEarly, kLate };
  // K splits of each matmul's chosen algorithm (where the prefetch starts).
  int splits[4];
  for (int i = 0; i < 4; ++i) {
    uint32_t sk = 1;
    size_t got = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&best[i], CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof(sk), &got) !=
            CUBLAS_STATUS_SUCCESS ||
        sk < 1)
      sk = 1;
    splits[i] = int(sk);
    std::printf("%s: %d K splits\n", shapes[i].name, splits[i]);
  }
  auto capture = [&](Edges edges, bool small_kernels = true, int prefetch_div = 0) {
    const bool late = edges == Edges::kLate, programmatic = edges != Edges::kOrdinary;
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int l = 0; l < kLayers; ++l)
      for (int i = 0; i < 4; ++i) {
        const unsigned pitch = unsigned(shapes[i].k) * 2;
        const Prefetch pf{reinterpret_cast<const char*>(w[i][l]), shapes[i].n, splits[i], pitch,
                          prefetch_div ? (pitch / unsigned(splits[i]) / unsigned(prefetch_div)) & ~15u : 0u};
        if (small_kernels) launch_small(late, y, x, T * shapes[i].k, s, prefetch_div ? &pf : nullptr);
        run_gemm(g[i], best[i], w[i][l], x, y, s);
      }
    CK(cudaStreamEndCapture(s, &graph));
    int changed = 0;
    if (programmatic)
      changed = make_programmatic(
          graph, {late ? reinterpret_cast<const void*>(small_copy<true>) : reinterpret_cast<const void*>(small_copy<false>)});
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    cudaGraphDestroy(graph);
    if (programmatic) std::printf("%d edges made programmatic\n", changed);
    return exec;
  };
  cudaGraphExec_t plain = capture(Edges::kOrdinary), prog = capture(Edges::kEarly), late = capture(Edges::kLate),
                  bare = capture(Edges::kOrdinary, false);
  // The late graph must compute what the ordinary one does, bit for bit.
  auto result_of = [&](cudaGraphExec_t ex) {
    fill_random<<<1024, 256, 0, s>>>(y, size_t(256) * 22016, 11);
    CK(cudaGraphLaunch(ex, s));
    CK(cudaStreamSynchronize(s));
    std::vector<uint16_t> out(size_t(T) * 4096);
    CK(cudaMemcpy(out.data(), y, out.size() * 2, cudaMemcpyDeviceToHost));
    return out;
  };
  const std::vector<uint16_t> want = result_of(plain);
  int late_equal = 0;
  for (int r = 0; r < 10; ++r) late_equal += result_of(late) == want;
  std::printf("late-release graph equals the ordinary graph's output in %d of 10 replays\n", late_equal);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  auto time = [&](cudaGraphExec_t ex) {
    for (int i = 0; i < 5; ++i) CK(cudaGraphLaunch(ex, s));
    CK(cudaEventRecord(e0, s));
    constexpr int kReps = 30;
    for (int i = 0; i < kReps; ++i) CK(cudaGraphLaunch(ex, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return ms / kReps;
  };
  double bytes = 0;
  for (const Shape& sh : shapes) bytes += double(sh.n) * sh.k * 2 * kLayers;
  std::printf("T=%d, 32 layers x 4 matmuls (%.2f GB of weights; %.3f ms at 4,261 GB/s), ms per pass:\n", T, bytes / 1e9,
              bytes / 4261e9 * 1e3);
  for (int div : {32, 16, 8, 4, 2}) {
    cudaGraphExec_t pf = capture(Edges::kOrdinary, true, div);
    const float a = time(plain), b = time(pf), a2 = time(plain), b2 = time(pf);
    std::printf("  L2 prefetch of 1/%d of each weight by the small kernel before it: %.3f / %.3f ms vs %.3f / %.3f "
                "(%+.1f%%)\n",
                div, b, b2, a, a2, 100.0 * (b + b2 - a - a2) / (a + a2));
    cudaGraphExecDestroy(pf);
  }
  for (int r = 0; r < 4; ++r) {
    const float a = time(plain), b = time(prog), d = time(late), c = time(bare);
    std::printf("  small kernel before each matmul, ordinary edges %.3f | programmatic edges, early release %.3f "
                "(%+.1f%%%s) | programmatic edges, release at the end %.3f (%+.1f%%) | matmuls alone %.3f (%+.1f%%)\n",
                a, b, 100.0 * (b - a) / a, all_wait ? "" : ", incorrect: an upper bound", d, 100.0 * (d - a) / a, c,
                100.0 * (c - a) / a);
  }
  std::printf("done\n");
  return 0;
}
