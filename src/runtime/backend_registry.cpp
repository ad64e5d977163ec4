// Maps a device name to its backend. Device backends live in src/backend/.
#include "core/error.h"
#include "runtime/backend.h"

namespace serval {

std::unique_ptr<Backend> make_cpu_backend(int threads);  // backend/cpu/cpu_backend.cpp

std::unique_ptr<Backend> create_backend(const std::string& device, int threads) {
  if (device == "cpu") return make_cpu_backend(threads);
  fail("device \"", device, "\" is not available in this build (available: cpu)");
}

}  // namespace serval
