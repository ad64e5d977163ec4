#pragma once
// serval generate --input prompts.jsonl --output results.jsonl: offline batch
// mode. Every request goes to the engine at once; results come out in input
// order, with a progress bar on a terminal and a summary at the end.
#include <string>

#include "cli/generate_options.h"

namespace serval::cli {

int run_batch(const GenerateOptions& options, const std::string& model_path);

}  // namespace serval::cli
