// LtMatmul: cuBLASLt plans, their timing and the call itself (cuda_lt_matmul.h).
#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cstdio>
#include <string>

#include "backend/cuda/cuda_lt_matmul.h"
#include "backend/cuda/cuda_matmul_search.h"

namespace serval::cuda {

namespace {

constexpr int kCandidates = 8;  // heuristic results timed per shape (the H200's heuristic returns 8 at most)
constexpr int kTimedRuns = 3;   // after one warm-up run each
constexpr int64_t kSearchMaxTokens = 256;  // the wide search (search_) serves decode-sized shapes

void lt_check(cublasStatus_t st, const char* what) {
  SERVAL_CHECK(st == CUBLAS_STATUS_SUCCESS, "cuBLASLt: ", what, " failed with status ", int(st));
}

// Token counts that share a timed algorithm: 1, 2, 3, 4, 6, 8, 12, 16, 24, ...
// (powers of two and 1.5x them, rounded up). Prefill steps bring ever new
// token counts; timing each one would stall many steps.
int64_t token_bucket(int64_t n) {
  for (int64_t p = 1;; p *= 2) {
    if (p >= n) return p;
    if (p >= 2 && p + p / 2 >= n) return p + p / 2;
  }
}

struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    SERVAL_CUDA_CHECK(cudaEventCreate(&start));
    SERVAL_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~EventPair() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
};

}  // namespace

// Times a plan's algorithm on the real operands: one warm-up run, then `runs`
// runs, each between two events after an L2 flush (y is overwritten, as the
// call that follows does anyway).
class LtMatmul::RunTimer : public LtTimer {
 public:
  RunTimer(LtMatmul& lt, const Plan& p, const void* w, const void* x, void* y)
      : lt_(lt), p_(p), w_(w), x_(x), y_(y) {}

  float time(const cublasLtMatmulAlgo_t& algo, int runs) override {
    if (run(algo) != CUBLAS_STATUS_SUCCESS) return FLT_MAX;  // refuses these operands
    float total = 0.0f;
    for (int r = 0; r < runs; ++r) {
      lt_.flush_l2();
      SERVAL_CUDA_CHECK(cudaEventRecord(ev_.start, lt_.dev_.stream()));
      const bool ok = run(algo) == CUBLAS_STATUS_SUCCESS;
      SERVAL_CUDA_CHECK(cudaEventRecord(ev_.stop, lt_.dev_.stream()));
      SERVAL_CUDA_CHECK(cudaEventSynchronize(ev_.stop));
      if (!ok) return FLT_MAX;
      float ms = 0.0f;
      SERVAL_CUDA_CHECK(cudaEventElapsedTime(&ms, ev_.start, ev_.stop));
      total += ms;
    }
    return total / float(runs);
  }

 private:
  cublasStatus_t run(const cublasLtMatmulAlgo_t& algo) {
    const float one = 1.0f, zero = 0.0f;
    return cublasLtMatmul(lt_.lt_, p_.op, &one, w_, p_.a, x_, p_.b, &zero, y_, p_.c, y_, p_.c, &algo,
                          lt_.workspace_.data(), size_t(lt_.workspace_.bytes()), lt_.dev_.stream());
  }
  LtMatmul& lt_;
  const Plan& p_;
  const void* w_;
  const void* x_;
  void* y_;
  EventPair ev_;
};

// cuBLASLt is column-major: y^T [out, T] = W [in, out]^T-as-stored * x^T [in, T].
// Row-major W {out, in} is column-major [in, out] with ld = in, hence op(A) = T.
// A and B are in the activation dtype; the output is that too, or f32 for the
// LM head's logits (y_f32). The backend has one activation dtype, so the key
// need not hold it. The algorithm is the heuristic's first until
// tune() has timed the candidates.
LtMatmul::Plan& LtMatmul::plan(const GemmShape& s) {
  const int64_t m = s.m, n = s.n, k = s.k, ld = s.ld();
  const bool y_f32 = s.y_f32;
  const auto key = s.key();
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  Plan p;
  lt_check(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  lt_check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "set TRANSA");
  lt_check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "set TRANSB");
  const cudaDataType_t ab = cfg_.act_dtype == DType::F32 ? CUDA_R_32F : CUDA_R_16BF;
  lt_check(cublasLtMatrixLayoutCreate(&p.a, ab, uint64_t(k), uint64_t(m), ld), "layout A");
  lt_check(cublasLtMatrixLayoutCreate(&p.b, ab, uint64_t(k), uint64_t(n), ld), "layout B");
  lt_check(cublasLtMatrixLayoutCreate(&p.c, y_f32 ? CUDA_R_32F : ab, uint64_t(m), uint64_t(n), m), "layout C");
  if (s.batch > 1) {
    const int32_t count = int32_t(s.batch);
    const int64_t strides[3] = {s.stride_w, s.stride_x, s.stride_y};
    const cublasLtMatrixLayout_t layouts[3] = {p.a, p.b, p.c};
    for (int i = 0; i < 3; ++i) {
      lt_check(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                sizeof(count)),
               "set BATCH_COUNT");
      lt_check(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                &strides[i], sizeof(strides[i])),
               "set STRIDED_BATCH_OFFSET");
    }
  }
  cublasLtMatmulPreference_t pref = nullptr;
  lt_check(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
  const uint64_t ws = uint64_t(workspace_.bytes());
  lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
           "set workspace");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  SERVAL_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0, "cuBLASLt: no algorithm for a ", dtype_name(cfg_.act_dtype),
               " matmul of out ", m,
               ", tokens ", n, ", in ", k, " (status ", int(st), ")");
  p.algo = result.algo;
  return plans_.emplace(key, p).first->second;
}

// Picks p's algorithm once, outside graph capture (inside one the heuristic's
// first stays, untimed, and a later eager call tunes): the algorithm already
// timed for this shape's token bucket if cuBLASLt accepts it here, else the
// fastest of the heuristic's candidates, each run once to warm up and then
// kTimedRuns times, each between two events after an L2 flush, on the real
// operands (y is overwritten, as the call that follows does anyway). With
// --gemm-search (set_gemm_search), shapes of up to kSearchMaxTokens tokens
// then go through the wide search (cuda_matmul_search.cu), seeded with those
// candidates. The workspace is the fixed one, so the plan stays valid inside
// graphs.
//
// Why flush: a decode step reads every weight from HBM (the step's weights are
// hundreds of times L2), but a 4096 x 4096 bf16 weight (32 MB) run again and
// again stays in the H200's 50 MB L2, and warm timing ranks the candidates by
// L2 bandwidth instead.
void LtMatmul::tune(Plan& p, const GemmShape& s, const void* w, const void* x, void* y) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  SERVAL_CUDA_CHECK(cudaStreamIsCapturing(dev_.stream(), &capture));
  if (capture != cudaStreamCaptureStatusNone) return;
  p.tuned = true;
  const size_t ws_bytes = size_t(workspace_.bytes());
  GemmShape bucket = s;
  bucket.n = token_bucket(s.n);
  const auto key = bucket.key();
  if (auto it = tuned_algos_.find(key); it != tuned_algos_.end()) {
    cublasLtMatmulHeuristicResult_t check{};
    if (cublasLtMatmulAlgoCheck(lt_, p.op, p.a, p.b, p.c, p.c, &it->second, &check) == CUBLAS_STATUS_SUCCESS &&
        check.workspaceSize <= ws_bytes)
      p.algo = it->second;
    return;
  }
  const bool search = search_ && s.n <= kSearchMaxTokens;
  // The search's earlier result for this product, from its cache file.
  const GemmSearchCache::Key cache_key = {bucket.m,        bucket.n,        bucket.k,        bucket.y_f32,
                                          bucket.batch,    bucket.stride_w, bucket.stride_x, bucket.stride_y,
                                          bucket.ld(),     cfg_.act_dtype == DType::F32};
  if (search && searched_before(p, s.y_f32, cache_key, p.algo)) {
    tuned_algos_.emplace(key, p.algo);
    ++search_cache_hits_;
    return;
  }
  cublasLtMatmulPreference_t pref = nullptr;
  lt_check(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
  const uint64_t ws = uint64_t(ws_bytes);
  lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
           "set workspace");
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(lt_, p.op, p.a, p.b, p.c, p.c, pref, kCandidates, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0 || (found == 1 && !search)) {
    tuned_algos_.emplace(key, p.algo);
    return;
  }
  RunTimer timer(*this, p, w, x, y);
  float best_ms = FLT_MAX;
  cublasLtMatmulAlgo_t best = p.algo;
  std::vector<LtAlgo> seeds;
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS || results[i].workspaceSize > ws_bytes) continue;
    seeds.push_back({results[i].algo});
    const float ms = timer.time(results[i].algo, kTimedRuns);
    if (ms < best_ms) {
      best_ms = ms;
      best = results[i].algo;
    }
  }
  if (search) {
    const auto t0 = std::chrono::steady_clock::now();
    const LtSearchResult r = search_lt_algo({lt_, p.op, p.a, p.b, p.c, ws_bytes}, seeds, timer, kTimedRuns);
    const double search_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const bool wins = r.best_ms < best_ms;
    ++searches_;
    std::fprintf(stderr,
                 "gemm search: out %lld, tokens %lld, in %lld, batch %lld: %.2f us (heuristic %.2f us), %d "
                 "configurations in %.1f s%s%s\n",
                 (long long)s.m, (long long)s.n, (long long)s.k, (long long)s.batch,
                 1e3 * std::min(r.best_ms, best_ms), 1e3 * best_ms, r.tried, search_s, wins ? ": " : "",
                 wins ? describe_lt_algo(r.algo).c_str() : ", the heuristic's kept");
    if (wins) best = r.algo;
    if (search_cache_) {
      try {
        search_cache_->put(cache_key, lt_config_of(best));
      } catch (const Error& e) {  // (a full disk, say) the step goes on; only the file misses this product
        std::fprintf(stderr, "gemm search: %s\n", e.what());
      }
    }
  }
  p.algo = best;
  tuned_algos_.emplace(key, best);
}

// The search's choice for `key` in an earlier run (its cache file), if there
// is one and cuBLASLt accepts it for p's operands.
bool LtMatmul::searched_before(const Plan& p, bool y_f32, const GemmSearchCache::Key& key,
                               cublasLtMatmulAlgo_t& algo) const {
  const auto config = search_cache_ ? search_cache_->find(key) : std::nullopt;
  if (!config) return false;
  const cudaDataType_t ab = cfg_.act_dtype == DType::F32 ? CUDA_R_32F : CUDA_R_16BF;
  cublasLtMatmulAlgo_t a{};
  cublasLtMatmulHeuristicResult_t check{};
  if (!lt_algo_from_config(lt_, ab, y_f32 ? CUDA_R_32F : ab, *config, a) ||
      cublasLtMatmulAlgoCheck(lt_, p.op, p.a, p.b, p.c, p.c, &a, &check) != CUBLAS_STATUS_SUCCESS ||
      check.workspaceSize > size_t(workspace_.bytes()))
    return false;
  algo = a;
  return true;
}

void LtMatmul::set_search(bool on, const std::string& cache_file) {
  search_ = on || !cache_file.empty();
  search_cache_.reset();
  if (cache_file.empty()) return;
  cudaDeviceProp prop{};
  SERVAL_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev_.index()));
  // A configuration holds for this GPU model, SM count and library only.
  search_cache_ = std::make_unique<GemmSearchCache>(
      cache_file, str_cat(prop.name, ", ", dev_.num_sms(), " SMs, cuBLASLt ", cublasLtGetVersion()));
  if (search_cache_->set_aside())
    std::fprintf(stderr, "gemm search cache %s: written for another GPU or cuBLASLt; searching anew, it is replaced\n",
                 cache_file.c_str());
  else
    std::fprintf(stderr, "gemm search cache %s: %zu products\n", cache_file.c_str(), search_cache_->size());
}

// Evicts the weights from L2 by writing twice its size (allocated at the
// first tuning, from the memory kept out of the KV pool).
void LtMatmul::flush_l2() {
  if (l2_flush_.bytes() == 0) {
    int l2 = 0;
    SERVAL_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev_.index()));
    l2_flush_ = dev_.alloc(2 * std::max<int64_t>(l2, int64_t(1) << 20));
  }
  SERVAL_CUDA_CHECK(cudaMemsetAsync(l2_flush_.data(), 1, size_t(l2_flush_.bytes()), dev_.stream()));
}

LtMatmul::LtMatmul(CudaDevice& dev, const CudaConfig& cfg) : dev_(dev), cfg_(cfg) {
  dev_.bind();
  lt_check(cublasLtCreate(&lt_), "Create");
  workspace_ = dev_.alloc(int64_t(32) << 20);
}

LtMatmul::~LtMatmul() {
  cudaSetDevice(dev_.index());  // (no throwing from a destructor)
  for (auto& [key, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.op);
  }
  if (lt_) cublasLtDestroy(lt_);
}

void LtMatmul::run(const GemmShape& s, const void* w, const void* x, void* y) {
  SERVAL_CHECK(!cfg_.batch_invariant, "cuBLASLt matmul (out ", s.m, ", tokens ", s.n, ", in ", s.k,
               ") in batch-invariant mode");
  Plan& p = plan(s);
  if (!p.tuned) tune(p, s, w, x, y);
  if (s.batch > 1) ++batched_calls_;
  const float one = 1.0f, zero = 0.0f;
  lt_check(cublasLtMatmul(lt_, p.op, &one, w, p.a, x, p.b, &zero, y, p.c, y, p.c, &p.algo, workspace_.data(),
                          size_t(workspace_.bytes()), dev_.stream()),
           "Matmul");
}

}  // namespace serval::cuda
