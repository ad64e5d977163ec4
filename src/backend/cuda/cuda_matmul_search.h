// The wide search for a cuBLASLt product's algorithm (cuda_matmul_search.cu).
#pragma once

#include <cublasLt.h>

#include <cfloat>
#include <cstddef>
#include <string>
#include <vector>

#include "backend/cuda/cuda_gemm_search_cache.h"

namespace serval::cuda {

// cuBLASLt's algorithm struct under a name: nvcc 13's front end fails on the
// destructor of a container of the anonymous typedef.
struct LtAlgo {
  cublasLtMatmulAlgo_t algo{};
};

// A product's descriptors, as cublasLtMatmul takes them (C and D share c).
struct LtOperands {
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  size_t ws_bytes = 0;
};

// Runs the product with a given algorithm and times it.
class LtTimer {
 public:
  virtual ~LtTimer() = default;
  // The mean of `runs` cold runs, ms (FLT_MAX if it refuses the operands).
  virtual float time(const cublasLtMatmulAlgo_t& algo, int runs) = 0;
};

struct LtSearchResult {
  cublasLtMatmulAlgo_t algo{};
  float best_ms = FLT_MAX;  // the winner, over final_runs runs (FLT_MAX: none ran)
  int tried = 0;            // configurations timed
};

// Searches from the seeds (the heuristic's candidates): each configuration is
// timed once, the fastest few again over final_runs runs.
LtSearchResult search_lt_algo(const LtOperands& o, const std::vector<LtAlgo>& seeds, LtTimer& timer,
                              int final_runs);

// An algorithm's configuration, and back (for GemmSearchCache); false if
// this cuBLASLt refuses it for these dtypes.
LtConfig lt_config_of(const cublasLtMatmulAlgo_t& a);
bool lt_algo_from_config(cublasLtHandle_t lt, cudaDataType_t ab, cudaDataType_t cd, const LtConfig& c,
                         cublasLtMatmulAlgo_t& a);

// "id 66 tile 20 stages 35 split-k 1 ..." (for the search's log line).
std::string describe_lt_algo(const cublasLtMatmulAlgo_t& a);

}  // namespace serval::cuda
