#pragma once
// The CUDA backend's sampler (Backend::sample, start_sample, finish_sample),
// host side: the tasks of a call packed into pinned memory and sent in one
// copy, the kernels of cuda_sampling_kernels.cu queued on the device's stream
// after the LM head, their results read from pinned memory after that start's
// event (cuda_sampling.cu).
#include <memory>
#include <span>
#include <vector>

#include "backend/cuda/cuda_device.h"

namespace serval::cuda {

class CudaSampler {
 public:
  explicit CudaSampler(CudaDevice& dev);
  ~CudaSampler();
  CudaSampler(const CudaSampler&) = delete;
  CudaSampler& operator=(const CudaSampler&) = delete;

  void sample(const Tensor& logits, std::span<const SampleSpec> specs, std::vector<SampleResult>& out);
  void start(const Tensor& logits, std::span<const SampleSpec> specs);
  void finish(std::vector<SampleResult>& out);
  // Backend::sampled_tokens: the device array the latest start writes.
  const int32_t* sampled_tokens() { return token_buffer(0); }
  int started() const;
  bool ready() const;

  struct State;  // cuda_sampling.cu's

 private:
  // The device array sampled_tokens() returns, holding at least n tokens.
  int32_t* token_buffer(int64_t n);

  CudaDevice& dev_;
  std::unique_ptr<State> st_;  // buffers grow, never shrink
};

}  // namespace serval::cuda
