// Maps a device name to its backend. Device backends live in src/backend/.
#include "core/error.h"
#include "runtime/backend.h"

namespace serval {

std::unique_ptr<Backend> make_cpu_backend(int threads);  // backend/cpu/cpu_backend.cpp
#ifdef SERVAL_WITH_CUDA
std::unique_ptr<Backend> make_cuda_backend();  // backend/cuda/cuda_backend.cu
#endif

std::unique_ptr<Backend> create_backend(const std::string& device, int threads) {
  if (device == "cpu") return make_cpu_backend(threads);
#ifdef SERVAL_WITH_CUDA
  if (device == "cuda") return make_cuda_backend();
  fail("device \"", device, "\" is not available in this build (available: cpu, cuda)");
#else
  fail("device \"", device, "\" is not available in this build (available: cpu; built without CUDA)");
#endif
}

}  // namespace serval
