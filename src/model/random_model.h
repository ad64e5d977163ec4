#pragma once
// `serval random-model`: GGUF files of real model shapes with random weights, for
// benchmarks and memory planning. Weights are N(0, 0.02) (norm weights near 1), so
// logits are not flat; they are generated in parallel straight into the mmap'd
// output from a counter-based RNG, so the file depends only on the seed.
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/model_config.h"

namespace serval {

// Shapes Serval knows by name (published config.json values).
std::vector<std::string> random_model_names();  // "llama-3.1-8b", "llama-3.2-1b", "llama-2-7b", "qwen2.5-7b"

// The config for `like`: one of random_model_names(), or a path to a config.json.
ModelConfig random_model_config(const std::string& like);

// Writes the model (1-D norm and bias tensors in F32, the rest in `dtype`) with a
// synthetic tokenizer of the right size: SentencePiece-style with byte tokens for
// Llama 2 vocabularies, byte-level BPE otherwise.
void write_random_model(const std::string& like, DType dtype, const std::string& out_path, uint64_t seed = 0);
void write_random_model(const ModelConfig& config, DType dtype, const std::string& out_path, uint64_t seed = 0);

}  // namespace serval
