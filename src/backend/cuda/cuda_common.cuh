#pragma once
// Helpers shared by the CUDA backend's kernels: error checks, launches as
// programmatic dependents, bf16 vector loads, block-wide reductions.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <utility>

#include "backend/cuda/cuda_launch.h"
#include "core/error.h"

namespace serval::cuda {

using bf16 = __nv_bfloat16;

#define SERVAL_CUDA_CHECK(expr)                                                                       \
  do {                                                                                                \
    const cudaError_t serval_err_ = (expr);                                                           \
    if (serval_err_ != cudaSuccess)                                                                   \
      ::serval::fail("cuda: ", #expr, " failed: ", cudaGetErrorString(serval_err_), " at ", __FILE__, \
                     ":", __LINE__);                                                                  \
  } while (0)

// Checks the launch of the kernel just enqueued (bad configuration shows here;
// faults inside the kernel show at the next synchronization).
#define SERVAL_CUDA_LAUNCH_CHECK() SERVAL_CUDA_CHECK(cudaGetLastError())

inline int ceil_div(int64_t a, int64_t b) { return int((a + b - 1) / b); }

// A value worked out once per device (a kernel's occupancy, attributes set on
// a kernel): a process-wide cache that holds for every GPU, not just the
// first one used.
template <typename T>
class PerDevice {
 public:
  static constexpr int kMaxDevices = 64;
  template <typename Make>
  T get(int device, Make&& make) {
    SERVAL_CHECK(device >= 0 && device < kMaxDevices, "cuda: device ", device, " is past the ", kMaxDevices,
                 " this build counts");
    Slot& s = slots_[device];
    if (s.ready.load(std::memory_order_acquire)) return s.value;
    std::lock_guard<std::mutex> lock(mu_);
    if (!s.ready.load(std::memory_order_relaxed)) {
      s.value = make();
      s.ready.store(true, std::memory_order_release);
    }
    return s.value;
  }

 private:
  struct Slot {
    std::atomic<bool> ready{false};
    T value{};
  };
  Slot slots_[kMaxDevices];
  std::mutex mu_;
};

// The SM count of the device a launch goes to (Launch::device_sms, else the
// current device's).
inline int device_sms(const Launch& on) {
  if (on.device_sms > 0) return on.device_sms;
  int dev = 0, sms = 0;
  SERVAL_CUDA_CHECK(cudaGetDevice(&dev));
  SERVAL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

// Programmatic dependent launch (Hopper): `kernel` may be scheduled while the
// kernel before it on `stream` is still running, so its launch latency (and,
// for a GEMV, its first weight loads) overlaps that kernel's tail. The kernel
// must call pdl_wait() before it reads anything the previous kernel wrote;
// it may call pdl_launch_dependents() once the next kernel may be scheduled.
// With on.pdl off (CudaTuning::pdl) they launch as plain kernels (a
// debugging aid: the results must not change).
template <typename... KArgs, typename... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, const Launch& on, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = on.stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = on.pdl ? 1 : 0;
  SERVAL_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// Waits until the previous kernel of the stream has finished and its writes
// are visible (returns at once for a kernel launched without PDL).
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
// Lets the next kernel of the stream be scheduled now (it still waits for this
// one's completion at its own pdl_wait()).
__device__ __forceinline__ void pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" :::); }

// Eight bf16 values moved as one 16-byte access.
struct alignas(16) Bf16x8 {
  __nv_bfloat162 h[4];
};

__device__ __forceinline__ void bf16x8_to_f32(const Bf16x8& v, float* f) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __bfloat1622float2(v.h[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

__device__ __forceinline__ Bf16x8 f32_to_bf16x8(const float* f) {
  Bf16x8 v;
#pragma unroll
  for (int i = 0; i < 4; ++i) v.h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the whole block; every thread gets the result. `scratch` holds 32 floats.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}

}  // namespace serval::cuda
