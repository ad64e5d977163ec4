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
// 2. What is at stake: 32 layers of (small PDL kernel -> matmul) x 4, at T
//    rows, replayed as a graph with ordinary edges and with programmatic edges
//    into the matmuls. If the probe finds stale reads, the second graph
//    computes garbage and its time is only an upper bound of the gain.
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

__global__ void slow_writer(bf16* x, int n, long long spin_ns) {
  asm volatile("griddepcontrol.launch_dependents;" :::);
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < (unsigned long long)spin_ns);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = __float2bfloat16(1.0f);
}

// Stands for the small kernels between the matmuls (norm, rope, silu): waits,
// releases its dependents, copies n elements.
__global__ void small_copy(const bf16* in, bf16* out, int n) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" :::);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = in[i];
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

static void launch_small(const bf16* in, bf16* out, int n, cudaStream_t s) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(64);
  cfg.blockDim = dim3(256);
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CK(cudaLaunchKernelEx(&cfg, small_copy, in, out, n));
}

enum class Probe { kWaits, kStale, kOther, kNoEdge };

// Probes one candidate.
static Probe probe(const Gemm& g, const cublasLtMatmulAlgo_t& algo, const bf16* w, bf16* x, bf16* y,
                   cudaStream_t s) {
  const size_t nx = size_t(g.t) * g.k, ny = size_t(g.t) * g.n;
  std::vector<uint16_t> ref(ny), got(ny);  // bf16 bits
  // Reference: x = 1, ordinary launch.
  slow_writer<<<8, 256, 0, s>>>(x, int(nx), 0);
  run_gemm(g, algo, w, x, y, s);
  CK(cudaStreamSynchronize(s));
  CK(cudaMemcpy(ref.data(), y, ny * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemsetAsync(y, 0xff, ny * 2, s));
  cudaGraph_t graph;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  CK(cudaMemsetAsync(x, 0, nx * 2, s));
  slow_writer<<<8, 256, 0, s>>>(x, int(nx), 40000);
  run_gemm(g, algo, w, x, y, s);
  CK(cudaStreamEndCapture(s, &graph));
  const int changed = make_programmatic(graph, {reinterpret_cast<const void*>(slow_writer)});
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

  // 1. The probe, at T rows and at 32 and 256.
  bool all_wait = true;
  cublasLtMatmulAlgo_t best[4];
  for (int tt : {T, 32, 256}) {
    for (int i = 0; i < 4; ++i) {
      Gemm g = make_gemm(shapes[i].n, shapes[i].k, tt);
      cublasLtMatmulHeuristicResult_t c[8];
      const int nc = candidates(g, c);
      int count[4] = {};
      for (int a = 0; a < nc; ++a) ++count[int(probe(g, c[a].algo, w[i][0], x, y, s))];
      all_wait = all_wait && count[int(Probe::kWaits)] == nc;
      std::printf("probe T=%3d %-8s %d candidates: %d wait, %d stale, %d other results, %d start with no kernel\n", tt,
                  shapes[i].name, nc, count[0], count[1], count[2], count[3]);
      if (tt == T) best[i] = c[0].algo;
    }
  }
  std::printf("probe verdict: %s\n", all_wait ? "every candidate waits: programmatic edges into cuBLASLt are safe"
                                              : "some candidates do not wait: programmatic edges into cuBLASLt are NOT safe");

  // 2. Timing: 32 layers of (small -> qkv -> small -> o -> small -> gate_up -> small -> down).
  Gemm g[4];
  for (int i = 0; i < 4; ++i) g[i] = make_gemm(shapes[i].n, shapes[i].k, T);
  auto capture = [&](bool programmatic, bool small_kernels = true) {
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int l = 0; l < kLayers; ++l)
      for (int i = 0; i < 4; ++i) {
        if (small_kernels) launch_small(y, x, T * shapes[i].k, s);
        run_gemm(g[i], best[i], w[i][l], x, y, s);
      }
    CK(cudaStreamEndCapture(s, &graph));
    int changed = 0;
    if (programmatic) changed = make_programmatic(graph, {reinterpret_cast<const void*>(small_copy)});
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    cudaGraphDestroy(graph);
    if (programmatic) std::printf("%d edges made programmatic\n", changed);
    return exec;
  };
  cudaGraphExec_t plain = capture(false), prog = capture(true), bare = capture(false, false);
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
  for (int r = 0; r < 4; ++r) {
    const float a = time(plain), b = time(prog), c = time(bare);
    std::printf("  small kernel before each matmul, ordinary edges %.3f | programmatic edges %.3f (%+.1f%%%s) | "
                "matmuls alone %.3f (%+.1f%%)\n",
                a, b, 100.0 * (b - a) / a, all_wait ? "" : ", incorrect: an upper bound", c, 100.0 * (c - a) / a);
  }
  std::printf("done\n");
  return 0;
}
