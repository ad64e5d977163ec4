#include "eval/perplexity.h"

#include <cmath>

#include "core/error.h"

namespace serval {

double PerplexityResult::perplexity() const { return std::exp(mean_nll()); }

double token_nll(std::span<const float> logits, int32_t target) {
  SERVAL_CHECK(target >= 0 && size_t(target) < logits.size(), "token ", target, " is outside the vocabulary [0, ",
               logits.size(), ")");
  double max = logits[0];
  for (float v : logits) max = std::max(max, double(v));
  double sum = 0;
  for (float v : logits) sum += std::exp(double(v) - max);
  return std::log(sum) + max - double(logits[size_t(target)]);
}

PerplexityResult perplexity(ModelRunner& runner, const std::vector<int32_t>& tokens, const PerplexityOptions& o,
                            const PerplexityObserver& observer) {
  const int64_t ctx = o.ctx;
  SERVAL_CHECK(ctx >= 4, "the chunk size (--ctx) must be at least 4 tokens, got ", ctx);
  int64_t chunks = int64_t(tokens.size()) / ctx;
  SERVAL_CHECK(chunks >= 1, "the text has ", tokens.size(), " tokens, fewer than one chunk of ", ctx,
               ": give a longer text or a smaller --ctx");
  if (o.max_chunks > 0) chunks = std::min(chunks, o.max_chunks);
  const int32_t bs = runner.block_size();
  const int64_t vocab = runner.config().vocab_size;
  const int64_t first = ctx / 2;

  // One sequence at positions 0 .. ctx - 1 in blocks 0, 1, ...; logits for
  // the scored half.
  Batch b;
  b.query_start = {0, int32_t(ctx)};
  b.context_len = {int32_t(ctx)};
  b.max_blocks_per_seq = int32_t((ctx + bs - 1) / bs);
  for (int32_t k = 0; k < b.max_blocks_per_seq; ++k) b.block_table.push_back(k);
  for (int64_t p = 0; p < ctx; ++p) {
    b.positions.push_back(int32_t(p));
    b.slot_mapping.push_back(p);
  }
  for (int64_t j = first; j < ctx - 1; ++j) b.logits_rows.push_back(int32_t(j));

  PerplexityResult r;
  std::vector<float> logits;
  for (int64_t c = 0; c < chunks; ++c) {
    const auto begin = tokens.begin() + c * ctx;
    b.token_ids.assign(begin, begin + ctx);
    if (o.bos_id >= 0) b.token_ids[0] = o.bos_id;
    runner.forward(b, logits);
    SERVAL_CHECK(int64_t(logits.size()) == int64_t(b.logits_rows.size()) * vocab, "perplexity: the runner returned ",
                 logits.size(), " logits for ", b.logits_rows.size(), " rows of ", vocab);
    for (size_t i = 0; i < b.logits_rows.size(); ++i) {
      const int64_t j = b.logits_rows[i];
      const std::span<const float> row(logits.data() + int64_t(i) * vocab, size_t(vocab));
      const int32_t target = tokens[size_t(c * ctx + j + 1)];
      r.nll_sum += token_nll(row, target);
      ++r.scored;
      if (observer.on_row) observer.on_row(row, target);
    }
    ++r.chunks;
    r.running.push_back(r.perplexity());
    if (observer.on_chunk) observer.on_chunk(r);
  }
  return r;
}

}  // namespace serval
