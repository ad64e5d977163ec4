#pragma once
// A model from a GGUF file: ModelConfig from llama.cpp's metadata keys, and a
// WeightStore of views into the mmap'd tensor data.
#include <memory>
#include <string>

#include "model/gguf.h"
#include "model/model_loader.h"

namespace serval {

// Reads `{arch}.*` metadata (see llama.cpp's GGUF conventions) and the tensor
// list (vocab size from token_embd, tied output, q/k/v bias, q/k norm).
ModelConfig config_from_gguf(const GgufFile& file);

// Config + weights; every tensor the config needs must be present with its
// expected shape and a supported type. Other tensors of supported types are kept.
LoadedModel load_gguf_model(std::shared_ptr<GgufFile> file);
LoadedModel load_gguf_model(const std::string& path);

// Our own metadata keys for llama3 rope scaling, which llama.cpp encodes only in
// the rope_freqs.weight tensor.
inline constexpr const char* kLowFreqFactorKey = "serval.rope.scaling.low_freq_factor";
inline constexpr const char* kHighFreqFactorKey = "serval.rope.scaling.high_freq_factor";

}  // namespace serval
