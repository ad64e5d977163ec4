#pragma once
// The options of `serval generate` (one prompt, or a JSONL batch).
#include <cstdint>
#include <string>
#include <vector>

#include "cli/engine_flags.h"
#include "engine/engine.h"
#include "sampling/rng.h"
#include "tokenizer/tokenizer.h"

namespace serval::cli {

struct GenerateOptions {
  std::string model;
  std::string prompt;
  std::string input, output;  // batch mode
  int32_t max_tokens = 256;
  int32_t min_tokens = 0;
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  bool no_special = false;
  bool json = false;
  bool dump_logits = false;
  bool no_progress = false;
  EngineFlags engine;

  // The request of the single-prompt mode, without its prompt: the flags'
  // sampling and stop settings, EOS from the tokenizer, a drawn seed when
  // none is given (so it can be reported).
  EngineRequest request(const Tokenizer& tok) const {
    EngineRequest r;
    r.params = sampling;
    if (!r.params.seed) r.params.seed = random_seed();
    r.stop.max_tokens = max_tokens;
    r.stop.min_tokens = min_tokens;
    r.stop.eos_token_ids = eos_ids(tok);
    r.stop.ignore_eos = ignore_eos;
    r.stop_strings = stop;
    return r;
  }

  static std::vector<int32_t> eos_ids(const Tokenizer& tok) {
    if (!tok.eos_ids.empty()) return tok.eos_ids;
    if (tok.eos_id >= 0) return {tok.eos_id};
    return {};
  }
};

}  // namespace serval::cli
