// Maps a device name to its backend. Device backends live in src/backend/.
#include "core/error.h"
#include "model/model_def.h"
#include "runtime/backend.h"

namespace serval {

std::unique_ptr<Backend> make_cpu_backend(int threads);  // backend/cpu/cpu_backend.cpp
#ifdef SERVAL_WITH_CUDA
std::unique_ptr<Backend> make_cuda_backend(int device, DType act_dtype, const CudaTuning& tuning);  // backend/cuda/cuda_backend.cu
bool cuda_device_present();                                   // backend/cuda/cuda_backend.cu
bool cuda_attention_supports_head_dim(int64_t head_dim);       // backend/cuda/cuda_attention_decode.cu
#endif

namespace {

// The index N of "cuda:N" ("cuda": 0), or -1 for a name that is not a CUDA device.
int cuda_index(const std::string& device) {
  if (device == "cuda") return 0;
  if (device.rfind("cuda:", 0) != 0) return -1;
  const std::string n = device.substr(5);
  SERVAL_CHECK(!n.empty() && n.size() <= 4 && n.find_first_not_of("0123456789") == std::string::npos,
               "device \"", device, "\": expected cuda:N with N a GPU's index (cuda:0, cuda:1, ...)");
  return std::stoi(n);
}

}  // namespace

bool is_cuda_device(const std::string& device) { return cuda_index(device) >= 0; }

std::string resolve_device(const std::string& device) {
  if (device != "auto") return device;
#ifdef SERVAL_WITH_CUDA
  if (cuda_device_present()) return "cuda";
#endif
  return "cpu";
}

std::string device_cannot_run(const std::string& device, const ModelDef& def) {
  if (!is_cuda_device(device)) return "";  // the CPU's attention takes any
#ifdef SERVAL_WITH_CUDA
  // Sliding windows: every CUDA attention path takes them.
  const int64_t head_dim = def.config().head_dim;
  if (!cuda_attention_supports_head_dim(head_dim))
    return str_cat("no attention kernel for its head_dim of ", head_dim);
  return "";
#else
  (void)def;
  return "this build has no CUDA backend";
#endif
}

DType compute_dtype(const std::string& requested, const std::string& dtype) {
  SERVAL_CHECK(dtype == "auto" || dtype == "bfloat16" || dtype == "float32", "unknown dtype \"", dtype,
               "\" (expected auto, bfloat16 or float32)");
  const std::string device = resolve_device(requested);
  if (device == "cpu") {
    SERVAL_CHECK(dtype != "bfloat16", "dtype bfloat16 is not available on the CPU, which computes in float32: "
                 "use auto or float32 (bfloat16 needs a GPU, --device cuda)");
    return DType::F32;
  }
  return dtype == "float32" ? DType::F32 : DType::BF16;
}

std::unique_ptr<Backend> create_backend(const std::string& requested, int threads, const std::string& dtype,
                                        const CudaTuning& cuda_tuning) {
  const std::string device = resolve_device(requested);
  const DType act = compute_dtype(device, dtype);
  if (device == "cpu") return make_cpu_backend(threads);
#ifdef SERVAL_WITH_CUDA
  if (is_cuda_device(device)) return make_cuda_backend(cuda_index(device), act, cuda_tuning);
  fail("device \"", device, "\" is not available in this build (available: cpu, cuda, cuda:N)");
#else
  (void)act;
  (void)cuda_tuning;
  fail("device \"", device, "\" is not available in this build (available: cpu; built without CUDA)");
#endif
}

}  // namespace serval
