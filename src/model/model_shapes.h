#pragma once
// The tensors a Llama-family model needs, with their shapes, derived from its
// ModelConfig. Every loader checks its weights against this list, so a file whose
// tensors disagree with its own metadata fails at load time with a clear message.
#include <functional>
#include <string>
#include <vector>

#include "model/model_config.h"
#include "model/weights.h"

namespace serval {

struct ExpectedTensor {
  std::string name;            // GGUF name
  std::vector<int64_t> shape;  // outermost first
};

// All tensors the forward pass reads for this config (output.weight only when
// the embeddings are not tied; biases and q/k norms when the config has them).
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& config);
// The same, one at a time, global tensors first and then layer by layer: checks
// that throw on the first missing tensor stay cheap even when a hostile config
// claims millions of layers.
void for_each_expected_tensor(const ModelConfig& config, const std::function<void(const ExpectedTensor&)>& fn);

// Throws `missing tensor "NAME"` or `tensor "NAME" has shape [..], expected [..]`.
// An optional rope_freqs.weight must have rope_dim / 2 elements.
void check_weight_shapes(const ModelConfig& config, const WeightStore& weights);

// Name of the tensor holding per-frequency divisors for llama3 rope scaling
// (written by llama.cpp's converters; the runtime divides the frequencies by it).
inline constexpr const char* kRopeFreqsTensor = "rope_freqs.weight";

}  // namespace serval
