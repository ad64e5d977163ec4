#pragma once
// The engine knobs shared by the commands that run an Engine (serve; generate
// can adopt them): scheduler limits, KV pool size, prefix cache, threads.
#include <CLI/CLI.hpp>

#include "engine/engine.h"
#include "runtime/model_runner.h"

namespace serval::cli {

struct EngineFlags {
  RunnerOptions runner;
  EngineOptions engine;
  bool no_prefix_cache = false;

  // EngineOptions with the flags applied (prefix cache, model name).
  EngineOptions engine_options(const std::string& model_name) const;
};

void add_engine_flags(CLI::App& sub, EngineFlags& f);

}  // namespace serval::cli
