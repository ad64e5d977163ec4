#pragma once
// Perplexity of a model on a text, by llama.cpp's method (its `perplexity`
// tool), so that figures compare across the two: the tokens (with BOS first
// where the tokenizer adds one) cut into non-overlapping chunks of `ctx`
// tokens, each chunk's first token replaced by BOS (where the tokenizer adds
// one), each chunk one forward pass from position 0, and only the second half
// of each chunk scored (every scored token sees at least ctx / 2 tokens
// before it): the negative log-likelihood of token j + 1 from the logits at j,
// for j from ctx / 2 to ctx - 2. Perplexity is exp(mean NLL).
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "runtime/model_runner.h"

namespace serval {

struct PerplexityOptions {
  int64_t ctx = 512;         // tokens per chunk
  int64_t max_chunks = 0;    // 0: every whole chunk of the text
  int32_t bos_id = -1;       // >= 0: each chunk starts with it (the tokenizer adds BOS)
};

struct PerplexityResult {
  int64_t chunks = 0;
  int64_t scored = 0;           // tokens scored in all
  double nll_sum = 0;           // their negative log-likelihoods, natural log
  std::vector<double> running;  // the perplexity after each chunk
  double mean_nll() const { return scored > 0 ? nll_sum / double(scored) : 0.0; }
  double perplexity() const;
};

// -log softmax(logits)[target], in double.
double token_nll(std::span<const float> logits, int32_t target);

// What the scoring loop hands out: each scored row's logits (its target is
// the next token), and the result so far after each chunk.
struct PerplexityObserver {
  std::function<void(std::span<const float> logits, int32_t target)> on_row;
  std::function<void(const PerplexityResult&)> on_chunk;
};

// Scores `tokens` on `runner`, whose KV pool holds at least one chunk and
// whose steps take ctx tokens. Throws serval::Error when the text has no
// whole chunk.
PerplexityResult perplexity(ModelRunner& runner, const std::vector<int32_t>& tokens, const PerplexityOptions& o,
                            const PerplexityObserver& observer = {});

}  // namespace serval
