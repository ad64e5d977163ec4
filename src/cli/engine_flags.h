#pragma once
// The engine's knobs as command-line flags (serval generate; serve can reuse
// them), and loading a model into a runner with a planned KV pool.
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "kv/kv_memory_plan.h"
#include "model/model_loader.h"
#include "runtime/model_runner.h"
#include "tokenizer/tokenizer.h"

namespace serval::cli {

struct EngineFlags {
  SchedulerConfig scheduler;
  bool no_prefix_cache = false;
  std::string async_scheduling = "auto";  // EngineOptions::async_scheduling: auto, on or off
  bool no_async_scheduling = false;       // --no-async-scheduling: off
  bool no_late_continuations = false;     // EngineOptions::late_continuations off
  SpeculativeConfig speculative;          // --speculative, --num-speculative-tokens, --ngram-max/min
  int64_t kv_cache_tokens = 0;          // 0: from the memory fraction
  double kv_cache_memory_fraction = 0;  // 0: the runner's default pool
  int32_t block_size = 16;
  double gpu_memory_fraction = 0.9;    // on a GPU: weights + activations + KV pool
  bool enforce_eager = false;          // no CUDA graphs
  bool batch_invariant = false;        // RunnerOptions::batch_invariant
  bool gemm_search = false;            // RunnerOptions::gemm_search
  std::string gemm_search_cache;       // RunnerOptions::gemm_search_cache
  std::string cuda_tuning;             // --cuda-tuning key=value,... (RunnerOptions::cuda_tuning)
  int threads = 0;
  std::string device = "auto";         // cuda when there is a GPU, else cpu
  std::string dtype = "auto";          // auto (bf16 on a GPU), bfloat16 or float32
  std::string kv_cache_dtype = "auto"; // RunnerOptions::kv_cache_dtype: auto, fp8 or int8
};

void add_engine_flags(CLI::App& sub, EngineFlags& flags);

// A model ready for an Engine: weights, tokenizer, runner, and its KV plan.
struct LoadedEngineModel {
  LoadedModel model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ModelRunner> runner;
  KvMemoryPlan plan;
};

// Loads `path`, sizes the KV pool (--kv-cache-tokens, else
// --kv-cache-memory-fraction of the memory left after the weights, else the
// runner's default) and logs the plan to stderr. Throws serval::Error.
LoadedEngineModel load_engine_model(const std::string& path, const EngineFlags& flags);

EngineOptions engine_options(const EngineFlags& flags);

// --cuda-tuning parsed for a run on `device` (resolved): refused on the CPU,
// which has none of these knobs. Throws serval::Error.
CudaTuning cuda_tuning(const EngineFlags& flags, const std::string& device);

}  // namespace serval::cli
