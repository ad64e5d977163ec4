#pragma once
// Counters of the CUDA backend that tests read through the Backend interface
// (plain C++: no CUDA headers needed to include this).
#include <cstdint>

#include "runtime/backend.h"

namespace serval::cuda {

// cuBLASLt launches that computed several weights as one strided batch
// (matmul_multi); `be` must be the CUDA backend.
int64_t batched_gemm_calls(const Backend& be);

}  // namespace serval::cuda
