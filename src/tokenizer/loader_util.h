#pragma once
// Pieces shared by the GGUF and tokenizer.json loaders.
#include "tokenizer/tokenizer.h"

namespace serval {

// Fills tok.eos_ids: eos_id plus the end-of-turn tokens the vocabulary has
// (<|eot_id|>, <|eom_id|>, <|end_of_text|>, <|im_end|>, <|endoftext|>), and `extra`.
void collect_eos_ids(Tokenizer& tok, const std::vector<int32_t>& extra = {});

}  // namespace serval
