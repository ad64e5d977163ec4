#pragma once
// The calibration run of `serval quantize --calibration`: the float model on
// the CPU (f32) over the first tokens of a text, in windows of `ctx` (each a
// perplexity chunk: BOS first where the tokenizer adds one), keeping the
// statistics of the inputs of the named matmuls (runtime/activation_recorder.h).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/awq.h"

namespace serval {

struct CalibrationOptions {
  std::string file;        // UTF-8 text
  int64_t tokens = 4096;   // at most this many of its first tokens
  int64_t ctx = 512;       // tokens per window
  int64_t max_rows = 256;  // sampled input rows kept per matmul (evenly spread)
  int threads = 0;         // 0: all cores
};

// The text of `path`: throws naming the file when it cannot be opened, is
// empty, or is not text (a NUL byte, or not UTF-8).
std::string read_calibration_text(const std::string& path);

struct CalibrationResult {
  std::map<std::string, ChannelStats> stats;
  int64_t tokens = 0;       // tokens run
  double perplexity = 0;    // the float model's on them (a sanity check)
};

// Runs the model at `model_path` (a float GGUF) over the calibration text.
// Throws serval::Error for a bad text or one of fewer than 16 tokens.
CalibrationResult run_calibration(const std::string& model_path, const std::vector<std::string>& names,
                                  const CalibrationOptions& o);

}  // namespace serval
