#pragma once
// RoPE frequencies, computed once on the host and uploaded to the backend.
#include <vector>

#include "model/model_config.h"

namespace serval {

// The rope_dim / 2 inverse frequencies of `config`, as Hugging Face computes them:
//   inv_freq[i] = 1 / theta^(2i / rope_dim)        (f32, as torch does)
//   linear scaling: inv_freq / factor
//   llama3 scaling: transformers' _compute_llama3_parameters
// `freq_divisors` (GGUF's rope_freqs.weight, rope_dim / 2 values, may be empty)
// divides each frequency, as llama.cpp does. GGUF files carry Llama 3.1 scaling
// in that tensor, so when it is given, llama3 scaling is not applied a second time.
std::vector<float> rope_inv_freq(const ModelConfig& config, const std::vector<float>& freq_divisors);

}  // namespace serval
