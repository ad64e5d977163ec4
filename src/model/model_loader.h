#pragma once
// Loads a model's configuration and weights from a GGUF file or a Hugging Face
// folder (config.json + model.safetensors or sharded safetensors with an index).
#include <string>

#include "model/model_config.h"
#include "model/weights.h"

namespace serval {

struct LoadedModel {
  ModelConfig config;
  WeightStore weights;   // GGUF tensor names, outermost-first shapes (see weights.h)
  std::string path;
  std::string format;    // "gguf" or "hf"
};

// Detects the format from the path (a .gguf file, or a folder with config.json).
// Throws serval::Error naming the file and the problem (missing file, bad magic,
// truncated data, shape mismatch, unsupported dtype or architecture).
LoadedModel load_model(const std::string& path);

// Where the test and default models live: $SERVAL_MODELS, else "../shared/models".
std::string models_dir();

}  // namespace serval
