#pragma once
// What the CUDA backend's parts share besides the device: the activation
// dtype, the tuning (runtime/cuda_tuning.h), batch-invariant mode, and how
// their kernels launch from those.
#include "backend/cuda/cuda_cutlass_gemm.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_launch.h"
#include "runtime/cuda_tuning.h"

namespace serval::cuda {

struct CudaConfig {
  DType act_dtype = DType::BF16;  // activations, weight matrices and the KV cache
  CudaTuning tuning;
  // Only our own kernels, each row's bits independent of its batch (Backend::set_batch_invariant).
  bool batch_invariant = false;
};

// How our kernels launch on the device's stream (the tuning's pdl and gemv_sms).
inline Launch launch_on(const CudaDevice& dev, const CudaConfig& cfg) {
  const int sms = dev.num_sms();
  return {dev.stream(), cfg.tuning.pdl, cfg.tuning.gemv_sms > 0 ? std::min(cfg.tuning.gemv_sms, sms) : sms, sms};
}

// How CUTLASS's kernels launch (the tuning's cutlass_* fields).
inline CutlassLaunch cutlass_on(const CudaDevice& dev, const CudaConfig& cfg) {
  return {.stream = dev.stream(),
          .sms = dev.num_sms(),
          .pdl = cfg.tuning.pdl,
          .swap = cfg.tuning.cutlass_swap,
          .swap_gated = cfg.tuning.cutlass_swap_gated,
          .two_ctas = cfg.tuning.cutlass_two_ctas,
          .w_prefetch_k_blocks = cfg.tuning.cutlass_w_prefetch};
}

}  // namespace serval::cuda
