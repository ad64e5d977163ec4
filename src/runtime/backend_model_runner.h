#pragma once
// The ModelRunner of every device: the Llama-family forward pass written once
// against the Backend interface (backend_model_runner.cpp), on the backend
// RunnerOptions::device names.
#include <memory>

#include "runtime/model_runner.h"

namespace serval {

std::unique_ptr<ModelRunner> make_backend_model_runner(const ModelConfig& config, const WeightStore& weights,
                                                       const RunnerOptions& opts);

}  // namespace serval
