#pragma once
// Llama 3.1 ("llama3") RoPE scaling as per-frequency divisors, the form llama.cpp
// stores in the rope_freqs.weight tensor: the runtime divides frequency i
// (theta^(-2i/rope_dim)) by factors[i].
#include <vector>

#include "model/model_config.h"

namespace serval {

// rope_dim / 2 factors computed from config.rope_scaling (type Llama3).
std::vector<float> llama3_rope_factors(const ModelConfig& config);

}  // namespace serval
