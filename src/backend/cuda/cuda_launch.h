#pragma once
// Where our kernels launch and how (plain C++: the benchmarks include it).
#include <cuda_runtime.h>

namespace serval::cuda {

// A stream, whether kernels go on it as programmatic dependents of the
// kernel before them (launch_pdl; CudaTuning::pdl), and the SMs a persistent
// grid is planned for (0: all of the device's; CudaTuning::gemv_sms), and
// the device's SM count (0: the current device's, read at launch).
struct Launch {
  cudaStream_t stream = nullptr;
  bool pdl = true;
  int grid_sms = 0;
  int device_sms = 0;
};

}  // namespace serval::cuda
