// CudaBackend::sample. PLACEHOLDER: copies the logits to the host and samples
// there; to be replaced by GPU kernels (issue 5, item 5).
#include "backend/cuda/cuda_backend.h"

namespace serval::cuda {

void CudaBackend::sample(const Tensor& logits, std::span<const SampleSpec> specs, std::vector<SampleResult>& out) {
  thread_local Sampler sampler;
  std::vector<float> host(size_t(logits.numel()));
  tensor_to_host(logits, host.data());
  out.resize(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const SampleSpec& s = specs[i];
    const std::span<const float> row(host.data() + size_t(s.row) * size_t(logits.cols), size_t(logits.cols));
    out[i] = sampler.sample(row, *s.params, s.prompt_ids, s.output_ids, s.uniform, s.banned);
  }
}

}  // namespace serval::cuda
