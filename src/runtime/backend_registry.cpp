// Maps a device name to its backend. Device backends live in src/backend/.
#include "core/error.h"
#include "runtime/backend.h"

namespace serval {

std::unique_ptr<Backend> make_cpu_backend(int threads);  // backend/cpu/cpu_backend.cpp
#ifdef SERVAL_WITH_CUDA
std::unique_ptr<Backend> make_cuda_backend();  // backend/cuda/cuda_backend.cu
bool cuda_device_present();                    // backend/cuda/cuda_backend.cu
#endif

std::string resolve_device(const std::string& device) {
  if (device != "auto") return device;
#ifdef SERVAL_WITH_CUDA
  if (cuda_device_present()) return "cuda";
#endif
  return "cpu";
}

std::unique_ptr<Backend> create_backend(const std::string& requested, int threads) {
  const std::string device = resolve_device(requested);
  if (device == "cpu") return make_cpu_backend(threads);
#ifdef SERVAL_WITH_CUDA
  if (device == "cuda") return make_cuda_backend();
  fail("device \"", device, "\" is not available in this build (available: cpu, cuda)");
#else
  fail("device \"", device, "\" is not available in this build (available: cpu; built without CUDA)");
#endif
}

}  // namespace serval
