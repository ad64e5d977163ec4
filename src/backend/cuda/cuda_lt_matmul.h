#pragma once
// cuBLASLt products: a plan per shape (descriptors and an algorithm), the
// algorithm chosen at the shape's first use outside a graph capture by timing
// the heuristic's best candidates on the real operands, each after an L2
// flush (with the wide search, more: cuda_matmul_search.cu, its choices kept
// across runs in a cache file), the winner kept per (out, token bucket, in,
// out dtype, batch). Which products go to cuBLASLt: CudaMatmul.
#include <cublasLt.h>

#include <map>
#include <memory>
#include <string>

#include "backend/cuda/cuda_config.h"
#include "backend/cuda/cuda_gemm_search_cache.h"
#include "backend/cuda/cuda_gemm_shape.h"

namespace serval::cuda {

class LtMatmul {
 public:
  LtMatmul(CudaDevice& dev, const CudaConfig& cfg);
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  // The product `s`: W at w, x at x, y at y (never in batch-invariant mode:
  // cuBLASLt's kernels change with the batch size).
  void run(const GemmShape& s, const void* w, const void* x, void* y);
  // The wide search for shapes of up to 256 tokens (on, or a cache file
  // given), its results kept in `cache_file` across runs if one is given.
  void set_search(bool on, const std::string& cache_file);

  // Launches that computed several weights as one strided batch.
  int64_t batched_calls() const { return batched_calls_; }
  // Shapes the wide search has tuned, and shapes whose configuration came
  // from its cache file instead.
  int64_t searches() const { return searches_; }
  int64_t search_cache_hits() const { return search_cache_hits_; }

 private:
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool tuned = false;  // algo chosen by timing, not just the heuristic's first
  };
  class RunTimer;  // runs and times one plan's candidates
  Plan& plan(const GemmShape& s);
  void tune(Plan& p, const GemmShape& s, const void* w, const void* x, void* y);
  bool searched_before(const Plan& p, bool y_f32, const GemmSearchCache::Key& key, cublasLtMatmulAlgo_t& algo) const;
  void flush_l2();  // tune times candidates with a cold L2

  CudaDevice& dev_;
  const CudaConfig& cfg_;
  cublasLtHandle_t lt_ = nullptr;
  DeviceBuffer workspace_;
  DeviceBuffer l2_flush_;  // flush_l2's, allocated at the first tuning
  std::map<GemmShape::Key, Plan> plans_;  // by shape
  // Timed algorithms by the shape with the token count's bucket for n.
  std::map<GemmShape::Key, cublasLtMatmulAlgo_t> tuned_algos_;
  bool search_ = false;
  std::unique_ptr<GemmSearchCache> search_cache_;  // the search's results across runs, if a file was given
  int64_t batched_calls_ = 0, searches_ = 0, search_cache_hits_ = 0;
};

}  // namespace serval::cuda
