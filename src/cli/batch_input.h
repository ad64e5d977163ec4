#pragma once
// Reading a batch file: one OpenAI completions request object per line
// (prompt as a string or a list of token ids, max_tokens, temperature, top_p,
// top_k, min_p, seed, stop, n, logprobs, ignore_eos, min_tokens, presence /
// frequency / repetition_penalty, stop_token_ids). Fields a line leaves out
// take the command line's values; "model", "user" and "stream": false are
// accepted and ignored; any other field is an error (a typo would otherwise
// be silently ignored).
#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "tokenizer/tokenizer.h"

namespace serval::cli {

struct BatchItem {
  int64_t line = 0;  // 0-based line number in the file: the output's "index"
  EngineRequest request;
};

// Parses every non-blank line. Throws serval::Error listing every bad line
// (up to 20), each as `line N: field "F": what is wrong`.
std::vector<BatchItem> read_batch_input(std::istream& in, const Tokenizer& tok,
                                        const EngineRequest& defaults, bool add_special);

}  // namespace serval::cli
