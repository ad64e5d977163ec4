#pragma once
// The golden generation of stories260K (see ../shared/models/PROVENANCE.md):
// llama2.c's greedy output for "Once upon a time", as token ids after BOS.
#include <cstdint>
#include <vector>

#include "runtime/model_runner.h"

namespace serval::testing {

// [1, 403, 407, 261, 378]: BOS + "Once upon a time".
const std::vector<int32_t>& stories_prompt();
// The 256 reference ids after BOS (the prompt's 4 tokens, then the continuation).
const std::vector<int32_t>& stories_reference_ids();
// Greedy generation of `steps` tokens after the prompt with runner + argmax, for
// `copies` sequences in the same batches (the prompt of copy i prefilled in i+1
// chunks). Returns the tokens of each copy.
std::vector<std::vector<int32_t>> stories_greedy(ModelRunner& runner, int steps, int copies);

}  // namespace serval::testing
