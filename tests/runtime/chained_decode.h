#pragma once
// Greedy decoding through ModelRunner::start_sample / finish_sample, either one
// step at a time (each step's tokens taken before the next is queued) or
// chained (step N + 1 queued first, its decode tokens fed from step N's
// samples on the device through Batch::token_source). Both must give the
// same tokens on every backend.
#include <cstdint>
#include <vector>

#include "runtime/model_runner.h"

namespace serval::testing {

inline SamplingParams greedy_params() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

// Each prompt gets `steps` greedy tokens (penalized by `params`, whose
// temperature must be 0; chained, each spec names its fed token, which the
// penalties must count: SampleSpec::fed_source). The last prompt (when there
// are two or more) joins two steps late, its prefill in the same batch as
// the others' decodes. Specs list the rows in reverse, so a spec index is
// never a row index. Returns each prompt's tokens.
std::vector<std::vector<int32_t>> greedy_decode(ModelRunner& runner, const std::vector<std::vector<int32_t>>& prompts,
                                                int32_t steps, bool chained, SamplingParams params = greedy_params());

}  // namespace serval::testing
